//! RocketMQ namespaces as the Java clients' `namespace` setting has them: a topic or group
//! `name` in namespace `ns` is the broker's `ns%name`; retry and dead-letter topics keep their
//! prefix in front (`%RETRY%ns%group`); RocketMQ's system topics and groups are never wrapped.
//!
//! Guarantee: [`outside`] undoes [`inside`] for every name, so rows, metrics and logs can keep
//! the names users wrote while the broker sees its own.

use rocketmq_protocol::protocol::namespace_util::NamespaceUtil;
use std::borrow::Cow;

/// `name` (a topic or consumer group) as the broker names it in `namespace` (none: unchanged,
/// and not copied: the sink asks this for every send).
pub fn inside<'a>(namespace: Option<&str>, name: &'a str) -> Cow<'a, str> {
    match namespace {
        Some(namespace) => {
            Cow::Owned(NamespaceUtil::wrap_namespace(namespace, name.to_string()).to_string())
        }
        None => Cow::Borrowed(name),
    }
}

/// `name` as the broker names it, without `namespace` (none, or another one: unchanged).
pub fn outside(namespace: Option<&str>, name: &str) -> String {
    match namespace {
        Some(namespace) => NamespaceUtil::without_namespace_with_namespace(name, namespace),
        None => name.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_wrapped_as_the_java_clients_do_and_unwrapped_again() {
        let ns = Some("tenant-a");
        for (name, broker) in [
            ("orders", "tenant-a%orders"),
            ("tenant-a%orders", "tenant-a%orders"),
            ("%RETRY%billing", "%RETRY%tenant-a%billing"),
            ("%DLQ%billing", "%DLQ%tenant-a%billing"),
            ("TBW102", "TBW102"),
        ] {
            assert_eq!(inside(ns, name), broker, "{name}");
        }
        assert_eq!(outside(ns, "tenant-a%orders"), "orders");
        assert_eq!(outside(ns, "tenant-b%orders"), "tenant-b%orders");
        assert_eq!(inside(None, "orders"), "orders");
        assert_eq!(outside(None, "tenant-a%orders"), "tenant-a%orders");
    }
}

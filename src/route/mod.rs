//! Routing: one stable hash of `biz_key` picks both the ordered sender (shard) and the RocketMQ
//! queue, so a key's events are sent by one sender, to one queue, in commit order.
//!
//! The hash is Java's `String.hashCode` and the index `Math.abs(hash % n)`, exactly what
//! RocketMQ's `SelectMessageQueueByHash` does, so Java producers of the same keys agree with us.

use rocketmq_client_rust::JavaHashCode;

/// Java's `String.hashCode` (over UTF-16 code units, wrapping): the RocketMQ client's
/// [`JavaHashCode`], the hash its own `SelectMessageQueueByHash` takes of a string key.
pub fn java_string_hash(text: &str) -> i32 {
    text.java_hash_code()
}

/// `Math.abs(hash % n)`: the index `SelectMessageQueueByHash` picks among `n` queues.
pub fn index_for(hash: i32, n: usize) -> usize {
    assert!(n > 0, "no queues to pick from");
    (i64::from(hash) % n as i64).unsigned_abs() as usize
}

/// Picks the shard of a key among `shards` ordered senders.
#[derive(Debug, Clone, Copy)]
pub struct Router {
    shards: usize,
}

impl Router {
    pub fn new(shards: usize) -> Self {
        assert!(shards > 0, "at least one shard");
        Router { shards }
    }

    /// The shard of the key whose hash is `hash`.
    pub fn shard(&self, hash: i32) -> usize {
        index_for(hash, self.shards)
    }

    #[cfg(any(test, feature = "test-utils"))]
    pub fn shards(&self) -> usize {
        self.shards
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn matches_java_string_hash_code() {
        assert_eq!(java_string_hash(""), 0);
        assert_eq!(java_string_hash("a"), 97);
        assert_eq!(java_string_hash("hello"), 99_162_322);
        assert_eq!(java_string_hash("order-1"), -1_207_111_310);
        // Non-BMP characters hash as two UTF-16 surrogates, as in Java.
        assert_eq!(java_string_hash("😀"), 0xD83D * 31 + 0xDE00);
    }

    #[test]
    fn picks_queues_like_select_message_queue_by_hash() {
        // Java: Math.abs(-1207111310 % 8) == 6 (the broker test pins the same queue).
        assert_eq!(index_for(java_string_hash("order-1"), 8), 6);
        assert_eq!(index_for(i32::MIN, 8), 0);
        assert_eq!(index_for(i32::MIN, 7), 2);
    }

    /// Values printed by OpenJDK 17.0.15 (`"…".hashCode()` and `Math.abs(hash % n)` in a
    /// scratch `.java` file), not computed by any Rust code: they pin the client's hash to Java's,
    /// surrogate pairs included, across upgrades of the client crate.
    #[test]
    fn matches_values_printed_by_java() {
        let java = [
            ("order-1", -1_207_111_310, 6, 6),
            // U+8BA2 U+5355: BMP, one UTF-16 unit each.
            ("订单-1", 1_085_411_543, 7, 6),
            // U+1F600: the surrogate pair D83D DE00.
            ("😀", 1_772_899, 3, 2),
            // U+1F680 (D83D DE80) amid ASCII.
            ("user-🚀-42", 1_674_276_390, 6, 3),
            ("Ünïcödé", 1_055_431_381, 5, 4),
        ];
        for (key, hash, of_8, of_7) in java {
            assert_eq!(java_string_hash(key), hash, "{key}");
            assert_eq!(index_for(hash, 8), of_8, "{key} among 8 queues");
            assert_eq!(index_for(hash, 7), of_7, "{key} among 7 queues");
        }
    }

    proptest! {
        #[test]
        /// The client's hash is Java's definition (`s[0]*31^(n-1) + … + s[n-1]` over UTF-16
        /// code units, wrapping), written out here as the oracle, for any key.
        fn is_javas_definition_for_any_key(key in "\\PC{0,40}", n in 1usize..64) {
            let java = key
                .encode_utf16()
                .fold(0i32, |h, unit| h.wrapping_mul(31).wrapping_add(i32::from(unit)));
            prop_assert_eq!(java_string_hash(&key), java);
            prop_assert!(index_for(java, n) < n);
        }
    }
}

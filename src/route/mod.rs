//! Routing: one stable hash of `biz_key` picks both the ordered sender (shard) and the RocketMQ
//! queue, so a key's events are sent by one sender, to one queue, in commit order.
//!
//! The hash is Java's `String.hashCode` and the index `Math.abs(hash % n)`, exactly what
//! RocketMQ's `SelectMessageQueueByHash` does, so Java producers of the same keys agree with us.

/// Java's `String.hashCode` over UTF-16 code units, wrapping.
pub fn java_string_hash(text: &str) -> i32 {
    text.encode_utf16().fold(0i32, |h, unit| {
        h.wrapping_mul(31).wrapping_add(i32::from(unit))
    })
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

    proptest! {
        #[test]
        fn agrees_with_the_client_crate(key in "\\PC{0,40}", n in 1usize..64) {
            use rocketmq_client_rust::JavaHashCode;
            let client_hash = key.as_str().java_hash_code();
            prop_assert_eq!(java_string_hash(&key), client_hash);
            prop_assert!(index_for(client_hash, n) < n);
        }
    }
}

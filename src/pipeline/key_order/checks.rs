//! What the key-order guard asked before each dispatcher batch of one table was handed on:
//! counted for the dispatcher's statistics and on `/metrics`
//! (`outbox_key_order_checks_total{asked}`).

/// What to ask before a batch of the table is handed on (also what `/metrics` counts).
#[derive(Debug, PartialEq, Eq)]
pub enum Question {
    /// Nothing: the batch's topics are clean and its ids follow on from what was read.
    None,
    /// The waiting rows with ids in this range (inclusive): the ids the stream skipped.
    Gap(u64, u64),
    /// Some keys' older waiting rows (of topics not known to be clean), after the gap if any.
    Keys,
}

impl Question {
    /// Its `asked` label on `/metrics`.
    pub fn label(&self) -> &'static str {
        use crate::metrics::KeyOrderAsked;
        match self {
            Question::None => KeyOrderAsked::NONE,
            Question::Gap(..) => KeyOrderAsked::GAP,
            Question::Keys => KeyOrderAsked::KEYS,
        }
    }
}

/// How many dispatcher batches of one table the guard let go after asking nothing, only about a
/// gap, or by key (`Question`); also on `/metrics` (`outbox_key_order_checks_total`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct KeyOrderChecks {
    pub none: u64,
    pub gap: u64,
    pub keys: u64,
}

impl KeyOrderChecks {
    pub(super) fn count(&mut self, question: &Question) {
        let asked = crate::metrics::KeyOrderAsked {
            asked: question.label(),
        };
        crate::metrics::relay()
            .key_order_checks
            .get_or_create(&asked)
            .inc();
        *match question {
            Question::None => &mut self.none,
            Question::Gap(..) => &mut self.gap,
            Question::Keys => &mut self.keys,
        } += 1;
    }

    /// Adds `other`'s counts.
    pub fn add(&mut self, other: KeyOrderChecks) {
        self.none += other.none;
        self.gap += other.gap;
        self.keys += other.keys;
    }
}

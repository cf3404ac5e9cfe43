//! The one vocabulary of a delivery's state, as operators speak it: the
//! CLI's `--status`, the console's `status=`, the API's `state`, the state
//! gauges and the overview all use these words, and each word has one rule:
//! [`State::of`] for a row read, [`State::predicate`] for a statement, both
//! from the same SQL (`mod.rs`: `processing_state!` and its siblings).
//!
//! The states do not overlap, so every row is in exactly one. A dead letter
//! stays `dead` even when hookinbox holds no body of it (a replay then says
//! so); a claim only GitHub can finish that is not dead is
//! `awaiting_redelivery`, and not `processing` or `retrying`. A leg whose
//! last outcome was a wait (held by its destination, deferred, behind its
//! key's earlier leg, yielding its installation's turn) is `waiting`, not
//! `retrying`: nothing failed.

use super::delivery::Delivery;
use super::{ErrorClass, Status, UnknownName};

/// What a delivery is, for an operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum State {
    /// Claimed or taken, not yet settled, and held by hookinbox (its job
    /// is queued or running, and its body is kept).
    Processing,
    /// The effect happened.
    Completed,
    /// Failed, and hookinbox will try again: a retry is scheduled.
    Retrying,
    /// Waiting, with no attempt spent: held by its destination (breaker
    /// open, paused, disabled), deferred to a time it was asked for,
    /// behind its key's earlier leg (ordered), or yielding its
    /// installation's turn (fair). The reason is its last error class.
    Waiting,
    /// Failed for good: a dead letter, until an operator replays or purges
    /// it.
    Dead,
    /// A claim hookinbox cannot finish on its own (no body kept, no job: a
    /// leg claimed before the claim wrote bodies): only a redelivery from
    /// GitHub can. The reconciler asks for one.
    AwaitingRedelivery,
    /// Its destination's filters did not take it.
    Filtered,
}

impl State {
    /// Every state.
    pub const ALL: [Self; 7] = [
        Self::Processing,
        Self::Completed,
        Self::Retrying,
        Self::Waiting,
        Self::Dead,
        Self::AwaitingRedelivery,
        Self::Filtered,
    ];

    /// Its word.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Processing => "processing",
            Self::Completed => "completed",
            Self::Retrying => "retrying",
            Self::Waiting => "waiting",
            Self::Dead => "dead",
            Self::AwaitingRedelivery => "awaiting_redelivery",
            Self::Filtered => "filtered",
        }
    }

    /// The state of a row as it was read. The same rule as
    /// [`State::predicate`]: the row's `awaiting_redelivery` column is that
    /// SQL, evaluated when it was read.
    pub fn of(d: &Delivery) -> Self {
        match d.status {
            Status::Completed => Self::Completed,
            Status::Filtered => Self::Filtered,
            Status::Failed if !d.retryable => Self::Dead,
            _ if d.awaiting_redelivery => Self::AwaitingRedelivery,
            Status::Failed if d.last_error_class.is_some_and(ErrorClass::is_wait) => Self::Waiting,
            Status::Failed => Self::Retrying,
            Status::Processing => Self::Processing,
        }
    }

    /// The rows in this state: a boolean SQL expression over the table
    /// `deliveries` (unaliased), with no parameters.
    pub fn predicate(self) -> &'static str {
        match self {
            Self::Processing => processing_state!(),
            Self::Completed => "(deliveries.status = 'completed')",
            Self::Retrying => retrying_state!(),
            Self::Waiting => waiting_state!(),
            Self::Dead => dead_state!(),
            Self::AwaitingRedelivery => awaiting_redelivery_state!(),
            Self::Filtered => "(deliveries.status = 'filtered')",
        }
    }

    /// The stored statuses its rows can have: which of a statement's
    /// branches (processing rows, settled rows) can hold them.
    pub fn statuses(self) -> &'static [Status] {
        match self {
            Self::Processing => &[Status::Processing],
            Self::Completed => &[Status::Completed],
            Self::Retrying | Self::Waiting | Self::Dead => &[Status::Failed],
            Self::AwaitingRedelivery => &[Status::Processing, Status::Failed],
            Self::Filtered => &[Status::Filtered],
        }
    }

    /// Every word a filter takes: the states, then `failed`.
    pub fn filter_words() -> [&'static str; 8] {
        let [a, b, c, d, e, f, g] = Self::ALL.map(Self::as_str);
        [a, b, c, d, e, f, g, FAILED]
    }

    /// The states a word of a filter names: one state by its word, or
    /// `failed` (the CLI's word from before these states), which means
    /// `retrying`, `waiting` or `dead` (every `failed` row in storage).
    pub fn parse_filter(word: &str) -> Result<Vec<Self>, UnknownName> {
        if word == FAILED {
            return Ok(vec![Self::Retrying, Self::Waiting, Self::Dead]);
        }
        word.parse().map(|s| vec![s])
    }
}

/// The alias a filter takes for `retrying`, `waiting` or `dead`.
pub const FAILED: &str = "failed";

impl std::str::FromStr for State {
    type Err = UnknownName;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|c| c.as_str() == s)
            .ok_or_else(|| UnknownName {
                what: "state",
                value: s.to_owned(),
                allowed: Self::filter_words().join(", "),
            })
    }
}

impl std::fmt::Display for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_word_parses_back_and_failed_means_retrying_waiting_or_dead() {
        for s in State::ALL {
            assert_eq!(s.as_str().parse::<State>(), Ok(s));
            assert_eq!(State::parse_filter(s.as_str()), Ok(vec![s]));
        }
        assert_eq!(
            State::parse_filter("failed"),
            Ok(vec![State::Retrying, State::Waiting, State::Dead])
        );
        let e = "gone".parse::<State>().expect_err("unknown");
        assert!(e.to_string().contains("waiting"), "{e}");
        assert!(e.to_string().contains("awaiting_redelivery"), "{e}");
    }

    #[test]
    fn each_error_class_is_spelled_alike_in_rust_and_sql() {
        let sql = [
            (ErrorClass::Transient, class!(transient)),
            (ErrorClass::Permanent, class!(permanent)),
            (ErrorClass::Timeout, class!(timeout)),
            (ErrorClass::Db, class!(db)),
            (ErrorClass::Poison, class!(poison)),
            (ErrorClass::Lost, class!(lost)),
            (ErrorClass::MaxAttempts, class!(max_attempts)),
            (ErrorClass::Publish, class!(publish)),
            (ErrorClass::Held, class!(held)),
            (ErrorClass::Deferred, class!(deferred)),
            (ErrorClass::DeferredTooLong, class!(deferred_too_long)),
            (ErrorClass::Ordered, class!(ordered)),
            (ErrorClass::Fair, class!(fair)),
            (ErrorClass::Stale, class!(stale)),
        ];
        assert_eq!(sql.len(), ErrorClass::ALL.len(), "every class");
        for (class, literal) in sql {
            assert_eq!(literal, format!("'{}'", class.as_str()));
        }
    }

    #[test]
    fn the_wait_classes_are_spelled_alike_in_rust_and_sql() {
        for class in ErrorClass::ALL {
            let in_sql = wait_classes!().contains(&format!("'{}'", class.as_str()));
            assert_eq!(class.is_wait(), in_sql, "{}", class.as_str());
        }
    }
}

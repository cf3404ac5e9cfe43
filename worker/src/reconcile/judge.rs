//! The verdict on one GUID: GitHub's attempts at it against what
//! hookinbox holds. Pure, so each rule is tested on its own.

use std::time::Duration;

use chrono::{DateTime, Utc};
use hookinbox::EventName;
use hookinbox::config::EventFilter;
use hookinbox::deliveries::Held;

use super::github::LoggedDelivery;

/// Every attempt GitHub logged for one GUID, newest first.
pub(crate) struct Attempts<'a>(pub(crate) Vec<&'a LoggedDelivery>);

impl Attempts<'_> {
    fn newest(&self) -> Option<&LoggedDelivery> {
        self.0
            .iter()
            .copied()
            .max_by_key(|d| (d.delivered_at, d.id))
    }

    fn oldest(&self) -> Option<&LoggedDelivery> {
        self.0
            .iter()
            .copied()
            .min_by_key(|d| (d.delivered_at, d.id))
    }

    fn any_succeeded(&self) -> bool {
        self.0.iter().any(|d| d.succeeded())
    }
}

/// The redeliveries already asked for a GUID, across passes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Asked {
    pub(crate) asked: i32,
    pub(crate) last_asked_at: DateTime<Utc>,
}

/// What the pass does about a GUID.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// GitHub saw no 2xx and hookinbox holds nothing it can finish: ask
    /// GitHub to send the delivery `id` again.
    Redeliver { id: i64 },
    /// GitHub saw no 2xx, but hookinbox completed it or holds it: it
    /// answered too late (or a 5xx after the claim). No redelivery.
    Late,
    /// GitHub saw a 2xx, hookinbox holds no row, and retention cannot
    /// explain it: a data-loss alarm.
    Unexplained,
    /// Nothing to do.
    Fine,
    /// An event the source does not take (or a ping): left alone.
    NotTaken,
    /// Its newest attempt is younger than the minimum age: it may still be
    /// in flight.
    Young,
    /// A redelivery was asked within the minimum age: its attempt may not
    /// be in the log yet.
    AskedRecently,
    /// Redelivered the most times allowed already.
    Capped,
}

/// The rules a source's pass judges by.
pub(crate) struct Rules<'a> {
    pub(crate) events: &'a EventFilter,
    pub(crate) min_age: Duration,
    pub(crate) max_redeliveries: u32,
    /// Completed deliveries older than this may have been swept.
    pub(crate) retention: Duration,
}

/// Judges one GUID at `now`.
pub(crate) fn judge(
    attempts: &Attempts<'_>,
    held: Option<Held>,
    asked: Option<Asked>,
    rules: &Rules<'_>,
    now: DateTime<Utc>,
) -> Verdict {
    let (Some(newest), Some(oldest)) = (attempts.newest(), attempts.oldest()) else {
        return Verdict::Fine;
    };
    let taken = EventName::parse(newest.event.as_bytes()).is_ok_and(|event| {
        event.as_str() != "ping" && rules.events.takes(&event, newest.action.as_deref())
    });
    if !taken {
        return Verdict::NotTaken;
    }
    let age = |at: DateTime<Utc>| (now - at).to_std().unwrap_or(Duration::ZERO);
    if age(newest.delivered_at) < rules.min_age {
        return Verdict::Young;
    }
    if attempts.any_succeeded() {
        return match held {
            Some(_) => Verdict::Fine,
            None if age(oldest.delivered_at) > rules.retention => Verdict::Fine,
            None => Verdict::Unexplained,
        };
    }
    match held {
        // Brought back by an earlier redelivery of ours, and held now.
        Some(Held::Completed | Held::Durable(_)) if asked.is_some() => Verdict::Fine,
        Some(Held::Completed | Held::Durable(_)) => Verdict::Late,
        Some(Held::AwaitingRedelivery) | None => match asked {
            Some(a) if a.asked >= rules.max_redeliveries as i32 => Verdict::Capped,
            Some(a) if age(a.last_asked_at) < rules.min_age => Verdict::AskedRecently,
            _ => Verdict::Redeliver { id: newest.id },
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hookinbox::deliveries::Status;

    fn attempt(id: i64, minutes_ago: i64, status_code: i64) -> LoggedDelivery {
        LoggedDelivery {
            id,
            guid: "g".to_owned(),
            delivered_at: Utc::now() - chrono::Duration::minutes(minutes_ago),
            status_code,
            event: "push".to_owned(),
            action: None,
            throttled_at: None,
        }
    }

    fn rules(events: &EventFilter) -> Rules<'_> {
        Rules {
            events,
            min_age: Duration::from_secs(300),
            max_redeliveries: 3,
            retention: Duration::from_secs(30 * 86400),
        }
    }

    #[test]
    fn each_rule() {
        let all = EventFilter::all();
        let r = rules(&all);
        let now = Utc::now();
        let failed = attempt(1, 60, 503);
        let ok = attempt(2, 30, 202);
        let young = attempt(3, 1, 503);
        let failed_only = Attempts(vec![&failed]);
        assert_eq!(
            judge(&failed_only, None, None, &r, now),
            Verdict::Redeliver { id: 1 }
        );
        assert_eq!(
            judge(&failed_only, Some(Held::AwaitingRedelivery), None, &r, now),
            Verdict::Redeliver { id: 1 }
        );
        assert_eq!(
            judge(&failed_only, Some(Held::Completed), None, &r, now),
            Verdict::Late
        );
        assert_eq!(
            judge(
                &failed_only,
                Some(Held::Durable(Status::Processing)),
                None,
                &r,
                now
            ),
            Verdict::Late
        );
        let asked = |n, minutes_ago| Asked {
            asked: n,
            last_asked_at: now - chrono::Duration::minutes(minutes_ago),
        };
        assert_eq!(
            judge(
                &failed_only,
                Some(Held::Completed),
                Some(asked(1, 20)),
                &r,
                now
            ),
            Verdict::Fine
        );
        assert_eq!(
            judge(&failed_only, None, Some(asked(3, 20)), &r, now),
            Verdict::Capped
        );
        assert_eq!(
            judge(&failed_only, None, Some(asked(1, 1)), &r, now),
            Verdict::AskedRecently
        );
        assert_eq!(
            judge(&failed_only, None, Some(asked(2, 20)), &r, now),
            Verdict::Redeliver { id: 1 }
        );
        let answered = Attempts(vec![&failed, &ok]);
        assert_eq!(
            judge(&answered, Some(Held::Completed), None, &r, now),
            Verdict::Fine
        );
        assert_eq!(judge(&answered, None, None, &r, now), Verdict::Unexplained);
        let in_flight = Attempts(vec![&failed, &young]);
        assert_eq!(judge(&in_flight, None, None, &r, now), Verdict::Young);
        let pushes_only = EventFilter::parse("f", ["issues"]).expect("filter");
        assert_eq!(
            judge(&failed_only, None, None, &rules(&pushes_only), now),
            Verdict::NotTaken
        );
        let mut ping = attempt(1, 60, 503);
        ping.event = "ping".to_owned();
        assert_eq!(
            judge(&Attempts(vec![&ping]), None, None, &r, now),
            Verdict::NotTaken
        );
    }

    #[test]
    fn a_success_older_than_retention_is_explained() {
        let all = EventFilter::all();
        let mut r = rules(&all);
        r.retention = Duration::from_secs(600);
        let old_ok = attempt(1, 60, 200);
        assert_eq!(
            judge(&Attempts(vec![&old_ok]), None, None, &r, Utc::now()),
            Verdict::Fine
        );
    }
}

//! The nodes of a RabbitMQ cluster in `AMQP_URL`: one URL per node,
//! comma-separated. A connection goes to one node; a process that loses
//! it (the node died, or is restarting) connects to the next on its next
//! try. The confirm and ack rules do not change with the node: a publish
//! the broker did not confirm is not a `202`, and a message not acked
//! comes back from whichever node leads its queue.

use std::sync::atomic::{AtomicUsize, Ordering};

/// The node this process tries first: the last one it reached. Starts at
/// one picked from the clock and the process id (every container's
/// process may be pid 1), so the processes of a deployment spread their
/// connections over the nodes.
static FIRST: AtomicUsize = AtomicUsize::new(usize::MAX);

/// Each node's URL, in the order given; empty parts are skipped.
pub(crate) fn urls(list: &str) -> Vec<&str> {
    list.split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .collect()
}

/// The indexes of `count` nodes in the order to try them: from the one
/// this process reached last (or its start), then the others in turn.
pub(crate) fn order(count: usize) -> impl Iterator<Item = usize> {
    let first = match FIRST.load(Ordering::Relaxed) {
        usize::MAX => {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
            (nanos ^ std::process::id()) as usize
        }
        i => i,
    };
    (0..count).map(move |i| (first + i) % count.max(1))
}

/// Notes that node `i` answered: the next connection tries it first.
pub(crate) fn reached(i: usize) {
    FIRST.store(i, Ordering::Relaxed);
}

/// Notes that the connection to node `i` was lost or failed: the next
/// connection tries the node after it first.
pub(crate) fn lost(i: usize, count: usize) {
    FIRST.store((i + 1) % count.max(1), Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_splits_into_its_nodes() {
        assert_eq!(
            urls("amqp://a:5672/%2f, amqp://b:5672/%2f,,amqp://c/%2f"),
            ["amqp://a:5672/%2f", "amqp://b:5672/%2f", "amqp://c/%2f"]
        );
        assert_eq!(urls("amqp://a/%2f"), ["amqp://a/%2f"]);
    }

    #[test]
    fn every_node_is_tried_once_from_the_last_reached() {
        reached(2);
        assert_eq!(order(3).collect::<Vec<_>>(), [2, 0, 1]);
        lost(2, 3);
        assert_eq!(order(3).collect::<Vec<_>>(), [0, 1, 2]);
    }
}

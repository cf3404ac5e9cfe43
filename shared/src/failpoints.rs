//! Kill points for the fault-injection suite, compiled only with the
//! `failpoints` feature. `FAILPOINTS="worker.mid_effect=1*return"` (the
//! `fail` crate's syntax) makes the process kill itself with SIGKILL the
//! first time it passes that point: no destructor, no ack, no rollback
//! message, exactly like `kill -9` from outside.
//!
//! Points: `ingest.after_claim` (claimed, not yet published),
//! `worker.after_take` (taken, before the effect), `worker.mid_effect`
//! (`store`: effect written, not committed; `forward`: the receiver
//! answered 2xx, the completion not yet committed), `worker.after_commit`
//! (committed, not acked).

/// Marks a kill point; expands to nothing without the feature.
#[macro_export]
macro_rules! kill_point {
    ($name:literal) => {
        #[cfg(feature = "failpoints")]
        $crate::failpoints::check($name);
    };
}

/// Installs the `FAILPOINTS` configuration (call once at start).
#[cfg(feature = "failpoints")]
pub fn setup() {
    let scenario = fail::FailScenario::setup();
    // Keep the configuration for the life of the process.
    std::mem::forget(scenario);
}

/// Kills this process with SIGKILL if the point `name` is armed.
#[cfg(feature = "failpoints")]
pub fn check(name: &'static str) {
    fail::fail_point!(name, |_| {
        eprintln!("failpoint {name}: kill -9");
        let pid = std::process::id().to_string();
        let _ = std::process::Command::new("kill")
            .args(["-9", &pid])
            .status();
        loop {
            std::thread::park();
        }
    });
}

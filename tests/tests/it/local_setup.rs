//! The setup `scripts/test.sh`, `scripts/run-local.sh` and `.ci/run` share
//! (`scripts/lib/services.sh`), in its dry run: what it would change on
//! this machine, where Postgres and RabbitMQ are up, and on a fresh Debian
//! machine without them.

use std::process::Command;

/// Runs `services_up` of the library in a dry run with `extra` variables;
/// returns its standard output.
fn dry_run(extra: &[(&str, &str)]) -> String {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace");
    let out = Command::new("bash")
        .args(["-c", ". scripts/lib/services.sh && services_up"])
        .current_dir(root)
        .env("HOOKINBOX_INSTALL_DRY_RUN", "1")
        .envs(extra.iter().copied())
        .output()
        .expect("bash runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn with_the_services_up_the_setup_installs_and_starts_nothing() {
    let said = dry_run(&[]);
    assert!(said.contains("postgres: up on 127.0.0.1:5432"), "{said}");
    assert!(said.contains("rabbitmq: up on 127.0.0.1:5672"), "{said}");
    assert!(!said.contains("would run"), "{said}");
}

#[test]
fn on_a_machine_without_them_the_setup_installs_the_pinned_packages_then_starts_them() {
    let said = dry_run(&[("HOOKINBOX_PRETEND_MISSING", "postgres rabbitmq")]);
    let runs: Vec<&str> = said
        .lines()
        .filter_map(|l| l.strip_prefix("would run: "))
        .collect();
    let step = |what: &str| {
        runs.iter()
            .position(|r| r.contains(what))
            .unwrap_or_else(|| panic!("no '{what}' in:\n{said}"))
    };
    // One package index update, then pinned, non-interactive installs.
    assert_eq!(
        runs.iter().filter(|r| r.contains("apt-get update")).count(),
        1,
        "{said}"
    );
    let postgres = step("postgresql-15=15.");
    let rabbitmq = step("rabbitmq-server=3.10.");
    for install in [postgres, rabbitmq] {
        assert!(
            runs[install].contains("DEBIAN_FRONTEND=noninteractive apt-get install -y"),
            "{}",
            runs[install]
        );
    }
    assert!(
        runs[postgres].contains("postgresql-client-15=15."),
        "{said}"
    );
    // Loopback clients in without a password, then each started.
    let trust = step("host all all 127.0.0.1/32 trust");
    let start_postgres = step("pg_ctlcluster --skip-systemctl-redirect 15 main start");
    let start_rabbitmq = step("rabbitmq-server -detached");
    assert!(step("apt-get update") < postgres);
    assert!(postgres < trust && trust < start_postgres, "{said}");
    assert!(
        start_postgres < rabbitmq && rabbitmq < start_rabbitmq,
        "{said}"
    );
}

/// Runs `services_apt_install chromium=PIN` in a dry run against an
/// archive that offers `offered` (apt-cache madison's lines); returns the
/// version its install names and what it said on standard error.
fn apt_version(pin: &str, offered: &str) -> (String, String) {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace");
    let script = format!(
        ". scripts/lib/services.sh && apt-cache() {{ printf '{offered}'; }} && services_apt_install 'chromium={pin}'"
    );
    let out = Command::new("bash")
        .args(["-c", &script])
        .current_dir(root)
        .env("HOOKINBOX_INSTALL_DRY_RUN", "1")
        .output()
        .expect("bash runs");
    assert!(out.status.success(), "{out:?}");
    let said = String::from_utf8_lossy(&out.stdout);
    let install = said
        .lines()
        .find(|l| l.contains("apt-get install"))
        .unwrap_or_else(|| panic!("no install in:\n{said}"));
    let version = install
        .split_once("chromium=")
        .map(|(_, v)| v.trim().to_owned())
        .unwrap_or_else(|| panic!("no chromium in: {install}"));
    (version, String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn a_pin_the_archive_has_replaced_falls_back_to_its_newest_build_and_says_so() {
    // Unordered, as an archive may list them.
    let archive = "  chromium | 150.0.7871.100-1~deb12u1 | http://deb.debian.org/debian bookworm/main amd64 Packages\\n  chromium | 156.0.8078.129-1~deb12u1 | http://deb.debian.org/debian-security bookworm-security/main amd64 Packages\\n  chromium | 156.0.8078.129~rc1-1 | http://deb.example/ Packages\\n";
    // Still offered: the pin, silently.
    let (version, said) = apt_version("150.0.7871.100-1~deb12u1", archive);
    assert_eq!(version, "150.0.7871.100-1~deb12u1");
    assert!(said.is_empty(), "{said}");
    // Replaced by a newer build of its major release: that build, said.
    let (version, said) = apt_version("156.0.8078.114-1~deb12u1", archive);
    assert_eq!(version, "156.0.8078.129-1~deb12u1");
    assert!(said.contains("no longer in the archive"), "{said}");
    assert!(said.contains("same major release"), "{said}");
    // Its major release gone: the newest offered, said.
    let (version, said) = apt_version("155.0.1-1", archive);
    assert_eq!(version, "156.0.8078.129-1~deb12u1");
    assert!(said.contains("none of the pin's major release"), "{said}");
}

//! Each bad setting makes the binary refuse to start, naming it.

use std::process::Command;

use hookinbox_tests::bin;

fn run(binary: &str, env: &[(&str, &str)]) -> (bool, String) {
    let mut cmd = Command::new(bin(binary));
    cmd.env_clear();
    if let Some(path) = std::env::var_os("PATH") {
        cmd.env("PATH", path);
    }
    // Point at nothing: a refusal must come before any connection.
    cmd.env("DATABASE_URL", "postgres://postgres@127.0.0.1:1/none")
        .env("AMQP_URL", "amqp://guest:guest@127.0.0.1:1/%2f")
        .env("HOOKINBOX_LOG_FORMAT", "text");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn each_bad_config_file_is_refused_naming_the_field() {
    let dir = std::env::temp_dir().join(format!("hookinbox-configs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let cases = [
        (
            "[[sources]]\nname = \"a\"\nsecrets = [\"s\"]\nhandler = { kind = \"shell\" }\n",
            "unknown variant `shell`",
        ),
        (
            "[[sources]]\nname = \"a\"\nsecrets = [\"s\"]\nhandler = { kind = \"forward\", url = \"ftp//nowhere\" }\n",
            "sources[0].handler.url",
        ),
        (
            "[[sources]]\nname = \"a\"\n",
            "sources[0].secrets: source 'a' has no secret",
        ),
        (
            "[[sources]]\nname = \"a\"\nsecrets = [\"\"]\n",
            "sources[0].secrets[0]: is empty",
        ),
        (
            "[[sources]]\nname = \"a\"\nsecrets = [\"s\"]\n[[sources]]\nname = \"a\"\nsecrets = [\"t\"]\n",
            "sources[1].name: 'a' is defined twice",
        ),
        (
            "[[sources]]\nname = \"a\"\nsecrets = [\"s\"]\nhook_ids = [\"12x\"]\n",
            "sources[0].hook_ids[0]",
        ),
        (
            "[[sources]]\nname = \"a\"\nsecret_files = [\"/dev/null\"]\n",
            "sources[0].secret_files[0]: /dev/null is not a regular file",
        ),
        (
            "[[sources]]\nname = \"a\"\nsecrets = [\"s\"]\nrate_limit = { per_second = 0 }\n",
            "sources[0].rate_limit.per_second: must be at least 1",
        ),
        (
            "[[sources]]\nname = \"a\"\nsecrets = [\"s\"]\nrate_limit = { per_second = 5, burst = 0 }\n",
            "sources[0].rate_limit.burst: must be at least 1",
        ),
        (
            "[[sources]]\nname = \"a\"\nsecrets = [\"s\"]\nrate_limit = { burst = 5 }\n",
            "missing field `per_second`",
        ),
        (
            "[[sources]]\nname = \"a\"\nsecrets = [\"s\"]\nreplay_guard = \"no\"\n",
            "line 4",
        ),
        // Destinations: the parser's own table of bad fields is
        // sources.rs's every_bad_destination_field_is_named; these check
        // both binaries refuse to start on them.
        (
            "[[sources]]\nname = \"a\"\nsecrets = [\"s\"]\n[[sources.destinations]]\nname = \"ci\"\nkind = \"forward\"\nurl = \"nowhere\"\n",
            "sources[0].destinations[0].url",
        ),
        (
            "[[sources]]\nname = \"a\"\nsecrets = [\"s\"]\n[[sources.destinations]]\nname = \"ci\"\nkind = \"store\"\nretry = [\"later\"]\n",
            "sources[0].destinations[0].retry[0]",
        ),
        (
            "[[sources]]\nname = \"a\"\nsecrets = [\"s\"]\n[[sources.destinations]]\nname = \"ci\"\nkind = \"store\"\n[[sources.destinations]]\nname = \"ci\"\nkind = \"store\"\n",
            "sources[0].destinations[1].name: 'ci' is defined twice",
        ),
    ];
    for (i, (text, expected)) in cases.iter().enumerate() {
        let path = dir.join(format!("{i}.toml"));
        std::fs::write(&path, text).expect("write");
        let path = path.to_string_lossy().into_owned();
        for binary in ["hookinbox-ingest", "hookinbox-worker"] {
            let (ok, stderr) = run(binary, &[("HOOKINBOX_CONFIG", &path)]);
            assert!(!ok, "{binary} {text:?} must refuse to start");
            assert!(
                stderr.contains(expected),
                "{binary}: expected '{expected}' in:\n{stderr}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn each_bad_setting_is_refused_by_name() {
    let dir = std::env::temp_dir().join(format!("hookinbox-settings-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let blank_line = dir.join("blank-line");
    std::fs::write(&blank_line, "new\n\nold\n").expect("write");
    let blank_line = blank_line.to_string_lossy().into_owned();
    let empty_file = dir.join("empty");
    std::fs::write(&empty_file, "\n").expect("write");
    let empty_file = empty_file.to_string_lossy().into_owned();
    let dir_path = dir.to_string_lossy().into_owned();
    let dir_refused = format!("HOOKINBOX_GITHUB_SECRET_FILE: {dir_path} is not a regular file");

    type Case<'a> = (&'a str, Vec<(&'a str, &'a str)>, &'a str);
    let cases: Vec<Case> = vec![
        ("hookinbox-ingest", vec![], "HOOKINBOX_GITHUB_SECRET"),
        (
            "hookinbox-ingest",
            vec![("HOOKINBOX_GITHUB_SECRET", "\n")],
            "HOOKINBOX_GITHUB_SECRET: is empty",
        ),
        (
            "hookinbox-ingest",
            vec![("HOOKINBOX_GITHUB_SECRET_FILE", &blank_line)],
            "HOOKINBOX_GITHUB_SECRET_FILE: line 2 is empty",
        ),
        (
            "hookinbox-ingest",
            vec![("HOOKINBOX_GITHUB_SECRET_FILE", &empty_file)],
            "HOOKINBOX_GITHUB_SECRET_FILE",
        ),
        (
            "hookinbox-ingest",
            vec![("HOOKINBOX_GITHUB_SECRET_FILE", "/nonexistent/secret")],
            "HOOKINBOX_GITHUB_SECRET_FILE",
        ),
        (
            "hookinbox-ingest",
            vec![
                ("HOOKINBOX_GITHUB_SECRET", "s"),
                ("DATABASE_URL", "postgres://host:notaport/db"),
            ],
            "DATABASE_URL",
        ),
        (
            "hookinbox-ingest",
            vec![
                ("HOOKINBOX_GITHUB_SECRET", "s"),
                ("AMQP_URL", "amqp://host:notaport"),
            ],
            "AMQP_URL",
        ),
        (
            "hookinbox-ingest",
            vec![
                ("HOOKINBOX_GITHUB_SECRET", "s"),
                ("HOOKINBOX_ALLOWED_EVENTS", "push,Not An Event"),
            ],
            "HOOKINBOX_ALLOWED_EVENTS",
        ),
        (
            "hookinbox-worker",
            vec![("DATABASE_URL", "postgres://host:notaport/db")],
            "DATABASE_URL",
        ),
        (
            "hookinbox-worker",
            vec![("AMQP_URL", "amqp://host:notaport")],
            "AMQP_URL",
        ),
        (
            "hookinbox-worker",
            vec![("HOOKINBOX_CONCURRENCY", "0")],
            "HOOKINBOX_CONCURRENCY",
        ),
        (
            "hookinbox-worker",
            vec![("HOOKINBOX_LEASE_SECS", "soon")],
            "HOOKINBOX_LEASE_SECS",
        ),
        (
            "hookinbox-ingest",
            vec![("HOOKINBOX_GITHUB_SECRET_FILE", &dir_path)],
            &dir_refused,
        ),
        (
            "hookinbox-ingest",
            vec![("HOOKINBOX_GITHUB_SECRET_FILE", "/dev/null")],
            "HOOKINBOX_GITHUB_SECRET_FILE: /dev/null is not a regular file",
        ),
        (
            "hookinbox-worker",
            vec![("HOOKINBOX_DB_POOLER", "transaction")],
            "HOOKINBOX_DIRECT_DATABASE_URL: required with HOOKINBOX_DB_POOLER=transaction",
        ),
        (
            "hookinbox-ingest",
            vec![
                ("HOOKINBOX_GITHUB_SECRET", "s"),
                ("HOOKINBOX_DB_POOLER", "session"),
            ],
            "'session' is not a pooler mode (none or transaction)",
        ),
        (
            "hookinbox-worker",
            vec![
                ("HOOKINBOX_DB_POOLER", "transaction"),
                (
                    "HOOKINBOX_DIRECT_DATABASE_URL",
                    "postgres://host:notaport/db",
                ),
            ],
            "HOOKINBOX_DIRECT_DATABASE_URL: not a valid Postgres URL",
        ),
        (
            "hookinbox-worker",
            vec![("HOOKINBOX_DB_IDLE_IN_TRANSACTION_TIMEOUT_MS", "30000")],
            "HOOKINBOX_DB_IDLE_IN_TRANSACTION_TIMEOUT_MS: must be longer than HOOKINBOX_HANDLER_TIMEOUT_MS",
        ),
        (
            "hookinbox-worker",
            vec![("HOOKINBOX_BATCH_LINGER_US", "100001")],
            "HOOKINBOX_BATCH_LINGER_US: must be at most 100000 (100 ms)",
        ),
        (
            "hookinbox-ingest",
            vec![
                ("HOOKINBOX_GITHUB_SECRET", "s"),
                ("HOOKINBOX_BATCH_LINGER_US", "-1"),
            ],
            "HOOKINBOX_BATCH_LINGER_US",
        ),
        (
            "hookinbox-worker",
            vec![("HOOKINBOX_RETENTION_COMPLETED", "6d")],
            "HOOKINBOX_RETENTION_COMPLETED: is under 7 days",
        ),
        (
            "hookinbox-worker",
            vec![
                ("HOOKINBOX_HANDLER", "forward"),
                ("HOOKINBOX_FORWARD_URL", "http://app.example/hook"),
                ("HOOKINBOX_FORWARD_SECRET", "s"),
                ("HOOKINBOX_FORWARD_SIGNATURE", "sha1"),
            ],
            "HOOKINBOX_FORWARD_SIGNATURE: 'sha1' is not github, hookinbox or none",
        ),
        (
            "hookinbox-worker",
            vec![
                ("HOOKINBOX_HANDLER", "forward"),
                ("HOOKINBOX_FORWARD_URL", "http://app.example/hook"),
                ("HOOKINBOX_FORWARD_SIGNATURE", "github"),
            ],
            "HOOKINBOX_FORWARD_SIGNATURE: github needs the destination's secret \
             (HOOKINBOX_FORWARD_SECRET)",
        ),
        (
            "hookinbox-worker",
            vec![
                ("HOOKINBOX_HANDLER", "forward"),
                ("HOOKINBOX_FORWARD_URL", "http://app.example/hook"),
                ("HOOKINBOX_FORWARD_SECRET", "s"),
                ("HOOKINBOX_FORWARD_SIGNATURE", "none"),
            ],
            "HOOKINBOX_FORWARD_SIGNATURE: is none, but a secret is given \
             (HOOKINBOX_FORWARD_SECRET)",
        ),
        (
            "hookinbox-worker",
            vec![("HOOKINBOX_EVENTS_RETENTION_DAYS", "7")],
            "HOOKINBOX_EVENTS_RETENTION_DAYS: is shorter than HOOKINBOX_RETENTION_COMPLETED (30 days)",
        ),
        (
            "hookinbox-worker",
            vec![
                ("HOOKINBOX_RETENTION_COMPLETED", "40d"),
                ("HOOKINBOX_EVENTS_RETENTION_DAYS", "39"),
            ],
            "HOOKINBOX_EVENTS_RETENTION_DAYS: is shorter than HOOKINBOX_RETENTION_COMPLETED (40 days)",
        ),
        (
            "hookinbox-ingest",
            vec![
                ("HOOKINBOX_GITHUB_SECRET", "s"),
                ("HOOKINBOX_RATE_LIMIT_BURST", "5"),
            ],
            "HOOKINBOX_RATE_LIMIT_BURST: is set without a rate; set HOOKINBOX_RATE_LIMIT_PER_SECOND too",
        ),
        (
            "hookinbox-ingest",
            vec![
                ("HOOKINBOX_GITHUB_SECRET", "s"),
                ("HOOKINBOX_RATE_LIMIT_PER_SECOND", "0"),
            ],
            "HOOKINBOX_RATE_LIMIT_PER_SECOND: must be at least 1",
        ),
        (
            "hookinbox-ingest",
            vec![
                ("HOOKINBOX_GITHUB_SECRET", "s"),
                ("HOOKINBOX_RATE_LIMIT_PER_SECOND", "ten"),
            ],
            "HOOKINBOX_RATE_LIMIT_PER_SECOND",
        ),
        (
            "hookinbox-ingest",
            vec![
                ("HOOKINBOX_GITHUB_SECRET", "s"),
                ("HOOKINBOX_REPLAY_GUARD", "maybe"),
            ],
            "HOOKINBOX_REPLAY_GUARD",
        ),
        (
            "hookinbox-ingest",
            vec![
                ("HOOKINBOX_CONFIG", "/nonexistent/sources.toml"),
                ("HOOKINBOX_REPLAY_GUARD", "false"),
            ],
            "HOOKINBOX_CONFIG: defines each source's replay_guard and rate_limit",
        ),
    ];
    // A destination's kind no handler is registered for: only a worker
    // runs handlers, so only the worker refuses it.
    let custom = dir.join("custom.toml");
    std::fs::write(
        &custom,
        "[[sources]]\nname = \"a\"\nsecrets = [\"s\"]\n[[sources.destinations]]\nname = \"c\"\nkind = \"commit_counter\"\n",
    )
    .expect("write");
    let custom = custom.to_string_lossy().into_owned();
    let mut cases = cases;
    cases.push((
        "hookinbox-worker",
        vec![("HOOKINBOX_CONFIG", custom.as_str())],
        "destination a/c: no handler 'commit_counter' is registered",
    ));
    cases.push((
        "hookinbox-worker",
        vec![("HOOKINBOX_DESTINATIONS", "default/nowhere")],
        "HOOKINBOX_DESTINATIONS: 'default/nowhere' is not SOURCE/NAME of a configured destination",
    ));
    for (binary, env, expected) in cases {
        let (ok, stderr) = run(binary, &env);
        assert!(!ok, "{binary} {env:?} must refuse to start");
        assert!(
            stderr.contains(expected),
            "{binary} {env:?}: expected '{expected}' in:\n{stderr}"
        );
        assert!(
            !stderr.contains("notaport/db")
                || expected != "DATABASE_URL"
                || !stderr.contains("postgres://"),
            "no URL echoed"
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// The sources' settings are one argument group in both binaries, with the
/// same checks: beside a config file, each variable of the `default` source
/// would be ignored, so each binary refuses it, naming the file's setting.
#[test]
fn both_binaries_refuse_a_default_source_setting_beside_a_config_file() {
    // The check comes before the file is read: it need not exist.
    let config = ("HOOKINBOX_CONFIG", "/nonexistent/sources.toml");
    let cases = [
        (
            ("HOOKINBOX_ALLOWED_EVENTS", "push"),
            "HOOKINBOX_CONFIG: defines each source's events; unset HOOKINBOX_ALLOWED_EVENTS",
        ),
        (
            ("HOOKINBOX_GITHUB_SECRET", "s"),
            "HOOKINBOX_CONFIG: defines the sources' secrets",
        ),
        (
            ("HOOKINBOX_GITHUB_SECRET_FILE", "/nonexistent/secret"),
            "HOOKINBOX_CONFIG: defines the sources' secrets",
        ),
        (
            ("HOOKINBOX_REPLAY_GUARD", "false"),
            "HOOKINBOX_CONFIG: defines each source's replay_guard and rate_limit",
        ),
        (
            ("HOOKINBOX_RATE_LIMIT_PER_SECOND", "5"),
            "HOOKINBOX_CONFIG: defines each source's replay_guard and rate_limit",
        ),
        (
            ("HOOKINBOX_RATE_LIMIT_BURST", "5"),
            "HOOKINBOX_CONFIG: defines each source's replay_guard and rate_limit",
        ),
    ];
    for (setting, expected) in cases {
        for binary in ["hookinbox-ingest", "hookinbox-worker"] {
            let (ok, stderr) = run(binary, &[config, setting]);
            assert!(!ok, "{binary} with {setting:?} beside a config must refuse");
            assert!(
                stderr.contains(expected),
                "{binary} {setting:?}: expected '{expected}' in:\n{stderr}"
            );
        }
    }
}

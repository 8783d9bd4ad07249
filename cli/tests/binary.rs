//! The built `regolith` binary itself: its help and the exit code of a usage error. (Having an
//! integration test also makes `cargo test --workspace` build the binary before any test runs,
//! which the e2e and Python harnesses start.)

use std::process::Command;

const REGOLITH: &str = env!("CARGO_BIN_EXE_regolith");

#[test]
fn help_lists_the_subcommands_and_exits_0() {
    let out = Command::new(REGOLITH).arg("--help").output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    for sub in ["up", "status", "put", "get"] {
        assert!(text.contains(sub), "{sub} missing from --help:\n{text}");
    }
}

#[test]
fn an_unknown_flag_is_a_usage_error_exit_2() {
    let out = Command::new(REGOLITH)
        .arg("--no-such-flag")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--no-such-flag"));
}

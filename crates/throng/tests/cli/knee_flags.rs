//! `throng knee attack` takes `throng attack`'s target flags as they are:
//! the same flags with the same help, so what a user learned in one works
//! in the other.

use throng_testkit::process::text;

use crate::throng;

/// The help of `args`, from each target flag's line to the next flag.
fn target_flags_help(args: &[&str]) -> Vec<String> {
    let out = throng().args(args).arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = text(&out.stdout);
    let mut entries = Vec::new();
    for flag in [
        "--targets",
        "--url",
        "--method",
        "--header",
        "--body ",
        "--body-file",
    ] {
        let start = help
            .lines()
            .position(|l| l.trim_start().starts_with('-') && l.contains(flag))
            .unwrap_or_else(|| panic!("{args:?} --help has no {flag}:\n{help}"));
        let lines: Vec<&str> = help.lines().skip(start).collect();
        let end = lines[1..]
            .iter()
            .position(|l| l.trim().is_empty() || l.trim_start().starts_with('-'))
            .map_or(lines.len(), |i| i + 1);
        let entry = &lines[..end];
        entries.push(entry.join("\n"));
    }
    entries
}

#[test]
fn knee_attack_describes_the_target_flags_as_attack_does() {
    assert_eq!(
        target_flags_help(&["knee", "attack"]),
        target_flags_help(&["attack"])
    );
}

//! `llamad completions SHELL` and `llamad man` are generated from the clap definition and name every
//! subcommand of it (the oracle: the definition's subcommands as `llamad --help` lists them).

use std::process::Command;

fn llamad(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_llamad")).args(args).output().unwrap()
}

fn llamad_ok(args: &[&str]) -> String {
    let out = llamad(args);
    assert!(out.status.success(), "llamad {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// The subcommands `llamad --help` lists (its "Commands:" block), `help` left out.
fn subcommands() -> Vec<String> {
    let help = llamad_ok(&["--help"]);
    let block = help.split("Commands:").nth(1).unwrap().split("\n\n").next().unwrap();
    block
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| *n != "help")
        .map(str::to_string)
        .collect()
}

#[test]
fn completions_and_man_page_name_every_subcommand() {
    let subs = subcommands();
    assert_eq!(subs, ["serve", "check-config", "completions", "man"]);
    let (bash, zsh, fish) = (
        llamad_ok(&["completions", "bash"]),
        llamad_ok(&["completions", "zsh"]),
        llamad_ok(&["completions", "fish"]),
    );
    let man = llamad_ok(&["man"]);
    assert!(man.contains(".TH llamad 8"), "{man}");
    for s in &subs {
        assert!(
            bash.contains(&format!("llamad__subcmd__{}", s.replace('-', "__subcmd__"))),
            "bash lacks {s}"
        );
        assert!(zsh.contains(&format!("'{s}:")), "zsh lacks {s}");
        assert!(fish.contains(&format!("-a \"{s}\"")), "fish lacks {s}");
        assert!(man.contains(&format!("llamad\\-{}(8)", s.replace('-', "\\-"))), "man page lacks {s}");
    }
    assert_eq!(llamad(&["completions", "tcsh"]).status.code(), Some(2), "an unknown shell is a usage error");
}

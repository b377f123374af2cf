//! `llamactl completions bash|zsh|fish` and `llamactl man` are generated from the clap definition and
//! name every subcommand of it, nested ones included (the oracle: the definition itself, walked).

use std::process::Command;

use clap::CommandFactory;
use llamactl::cli::Cli;
use llamactl::cmd::docs::command_paths;

fn llamactl_ok(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_llamactl")).args(args).output().unwrap();
    assert!(out.status.success(), "llamactl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn completions_and_man_page_name_every_subcommand() {
    let paths = command_paths(&Cli::command());
    for want in [
        "llamactl run",
        "llamactl workers add",
        "llamactl cache verify",
        "llamactl jobs logs",
        "llamactl man",
    ] {
        assert!(paths.iter().any(|(p, _)| p == want), "{want} missing from {paths:?}");
    }
    let (bash, zsh, fish) = (
        llamactl_ok(&["completions", "bash"]),
        llamactl_ok(&["completions", "zsh"]),
        llamactl_ok(&["completions", "fish"]),
    );
    let man = llamactl_ok(&["man"]);
    assert!(man.starts_with(".ie") || man.contains(".TH llamactl 1"), "{man}");
    for (path, _) in &paths {
        let parts: Vec<&str> = path.split(' ').collect();
        let name = parts[parts.len() - 1];
        // bash: a case per command path (`llamactl__subcmd__cache__subcmd__ls`; clap_complete spells `-` as `__subcmd__` too).
        let key = parts.join("__subcmd__").replace('-', "__subcmd__");
        assert!(bash.contains(&key), "bash completion lacks {path} ({key})");
        // zsh: `'ls:description'`; fish: `-a "ls"` under its parent.
        assert!(zsh.contains(&format!("'{name}:")), "zsh completion lacks {path}");
        assert!(fish.contains(&format!("-a \"{name}\"")), "fish completion lacks {path}");
        // The man page's COMMANDS section: the full path in bold (roff escapes `-`).
        assert!(man.contains(&format!("\\fB{}\\fR", path.replace('-', "\\-"))), "man page lacks {path}");
    }
    // An unknown shell is a usage error.
    let out = Command::new(env!("CARGO_BIN_EXE_llamactl")).args(["completions", "tcsh"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}

//! `llamactl completions SHELL` and `llamactl man`: shell completions (`clap_complete`) and the man
//! page (`clap_mangen`) generated from the clap definition in [`crate::cli`], so they never drift from
//! the real command line. The man page ends with a COMMANDS section naming every subcommand with
//! its full path (`llamactl cache ls`), which the generated page alone lists only one level deep.

use std::io::Write;

use anyhow::Result;
use clap::CommandFactory;

use crate::cli::Cli;

/// Writes the completion script of `shell`.
pub fn completions(shell: clap_complete::Shell, out: &mut dyn Write) -> Result<()> {
    let mut cmd = Cli::command();
    // Into memory first: `generate` panics on a write error (`llamactl completions bash | head`).
    let mut buf = Vec::new();
    clap_complete::generate(shell, &mut cmd, "llamactl", &mut buf);
    out.write_all(&buf)?;
    Ok(())
}

/// Writes the man page (section 1).
pub fn man(out: &mut dyn Write) -> Result<()> {
    let cmd = Cli::command();
    clap_mangen::Man::new(cmd.clone()).section("1").render(out)?;
    let mut roff = clap_mangen::roff::Roff::new();
    roff.control("SH", ["COMMANDS"]);
    for (path, about) in command_paths(&cmd) {
        roff.control("TP", [] as [&str; 0]);
        roff.text([clap_mangen::roff::bold(path)]);
        roff.text([clap_mangen::roff::roman(about)]);
    }
    roff.control("SH", ["EXIT STATUS"]);
    roff.text([clap_mangen::roff::roman(
        "0 success; 1 an error, or a negative answer (cache verify found corruption, a job failed, a worker is \
         unhealthy); 2 a usage error.",
    )]);
    roff.to_writer(out)?;
    Ok(())
}

/// Every subcommand below `cmd` (depth first, `help` left out) as its full path and its one-line
/// description.
pub fn command_paths(cmd: &clap::Command) -> Vec<(String, String)> {
    fn walk(cmd: &clap::Command, prefix: &str, out: &mut Vec<(String, String)>) {
        for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
            let path = format!("{prefix} {}", sub.get_name());
            let about = sub.get_about().map(|a| a.to_string()).unwrap_or_default();
            out.push((path.clone(), about));
            walk(sub, &path, out);
        }
    }
    let mut out = Vec::new();
    walk(cmd, cmd.get_name(), &mut out);
    out
}

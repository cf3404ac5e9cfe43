//! `hookinbox-worker`: consumes jobs and runs their effects; its
//! subcommands are the operator's tools. The library does the work; this
//! file parses the command line and hands it over.

use std::process::ExitCode;

use clap::Parser;
use hookinbox_worker::Cli;

fn main() -> ExitCode {
    Cli::parse().run()
}

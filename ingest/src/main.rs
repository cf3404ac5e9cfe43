//! `hookinbox-ingest`: receives GitHub webhooks. The library does the
//! work; this file parses the command line and hands it over.

use std::process::ExitCode;

use clap::Parser;
use hookinbox_ingest::Cli;

fn main() -> ExitCode {
    Cli::parse().run()
}

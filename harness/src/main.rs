//! `kvproof`: turns scenario files into verdicts a CI can act on. See `kvproof --help` and the README.

mod cli;
mod error_text;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    // clap exits 2 on its own for usage errors (and 0 for --help / --version).
    let args = cli::Cli::parse();
    match cli::main(args) {
        Ok(code) => ExitCode::from(code as u8),
        Err(e) => {
            eprintln!("kvproof: error: {}", error_text::render(&e));
            ExitCode::from(kvproof::exit::USAGE as u8)
        }
    }
}

//! `kvproof`: turns scenario files into verdicts a CI can act on. See `kvproof --help` and the README.

mod cli;
mod error_text;

use std::process::ExitCode;

use clap::Parser;

/// The bundled engines run in this process too: large blocks line-aligned, as in `kvproof-engine`, so their
/// kernels' 64-byte row loads never straddle two cache lines.
#[global_allocator]
static ALLOCATOR: kvproof_engines::line_aligned::LineAligned = kvproof_engines::line_aligned::LineAligned;

fn main() -> ExitCode {
    // in-process engines run in this process: their heap in huge pages, as a stdio engine's
    kvproof_engines::huge_pages::rerun_with_huge_pages();
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

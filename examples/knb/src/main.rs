//! knb: RPC load tester and benchmark driver.
//!
//! Implemented: `knb raw` (raw Ethernet ping-pong between two DPDK
//! processes: the physical limit the TCP numbers are measured against).
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod raw;

#[derive(Parser)]
#[command(name = "knb", about = "luna benchmark driver")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Ethernet frames ping-ponged between two DPDK processes (no TCP).
    Raw(raw::RawArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let res = match cli.cmd {
        Cmd::Raw(a) => raw::run(a),
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("knb: error: {e}");
            ExitCode::from(1)
        }
    }
}

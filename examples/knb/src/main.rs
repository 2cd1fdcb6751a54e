//! knb: RPC load tester and benchmark driver.
//!
//! * `knb rpc --stack kernel|smoltcp|luna`: one measured run — sets up the testbed
//!   topology, starts the server and the client as processes in their namespaces,
//!   reports RPC/s, Gbit/s, latency percentiles and CPU, tears down.
//! * `knb bulk --stack ...`: one connection streaming (iperf-like), single-flow Gbit/s.
//! * `knb compare`: the stacks alternated A B A B … plus the raw memif ceiling, ratios.
//! * `knb sweep`: message size, iodepth, latency CDF and cores, as CSV and SVG figures.
//! * `knb server` / `knb client`: the two sides by hand (what `rpc` starts).
//! * `knb raw`: Ethernet ping-pong between two DPDK processes, no TCP (the ceiling).
//! * `knb service-check`: the error of the service-time emulation (`--service-mode`).
//! * `knb hiccups`: how calm the machine is (gaps of a clock-spinning thread per CPU).
//!
//! Exit status: 0 success, 1 the run failed, 2 bad arguments.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod backend;
mod compare;
mod contention;
mod cpu;
mod engine;
mod hiccups;
mod hostlink;
mod proto;
mod raw;
mod report;
mod run;
mod servers;
mod service;
mod slo;
mod stalls;
mod svg;
mod sweep;
mod workload;

#[derive(Parser)]
#[command(
    name = "knb",
    about = "luna benchmark driver: RPC load tester for luna, the kernel and smoltcp"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// One RPC run: topology up, server + client, report, topology down.
    Rpc(run::RpcArgs),
    /// One connection streaming one way (iperf-like): single-flow Gbit/s.
    Bulk(run::RpcArgs),
    /// Stacks alternated A B A B ... plus the raw ceiling; ratios (median of rounds).
    Compare(compare::CompareArgs),
    /// Message size, iodepth, latency CDF and cores sweeps: CSV + SVG figures.
    Sweep(sweep::SweepArgs),
    /// The server side of a run (started by `rpc` in its namespace).
    Server(run::ServerArgs),
    /// The client side of a run (started by `rpc` in its namespace).
    Client(run::ClientArgs),
    /// Ethernet frames ping-ponged between two DPDK processes (no TCP).
    Raw(raw::RawArgs),
    /// Service-time emulation error (actual - requested) of spin and sleep modes.
    ServiceCheck(service::CheckArgs),
    /// How calm the machine is: a pinned thread per CPU spins on the clock and counts the
    /// gaps (time it did not run).
    Hiccups(hiccups::HiccupsArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let res = match cli.cmd {
        Cmd::Raw(a) => raw::run(a).map_err(workload::Error::Run),
        Cmd::Rpc(a) => run::rpc(a),
        Cmd::Bulk(mut a) => {
            a.workload.mode = workload::ModeArg::Bulk;
            run::rpc(a)
        }
        Cmd::Compare(a) => compare::run(a),
        Cmd::Sweep(a) => sweep::run(a),
        Cmd::Server(a) => {
            workload::check_ip("--ip", a.ip, a.prefix_len, a.stack).and_then(|()| run::server(a))
        }
        Cmd::Client(a) => workload::check_ip("--ip", a.ip, a.prefix_len, a.stack)
            .and_then(|()| workload::check_ip("--server-ip", a.server_ip, a.prefix_len, a.stack))
            .and_then(|()| run::client(a)),
        Cmd::ServiceCheck(a) => service::check(a),
        Cmd::Hiccups(a) => hiccups::run(a),
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(workload::Error::Usage(e)) => {
            eprintln!("knb: error: {e}");
            ExitCode::from(2)
        }
        Err(workload::Error::Run(e)) => {
            eprintln!("knb: error: {e}");
            ExitCode::from(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `knb rpc` and `knb bulk` take `--wait-near` as `knb compare` does: bounded seconds,
    /// 0 (the default) not waiting, anything else refused with the reason.
    #[test]
    fn rpc_takes_wait_near_bounded() {
        let parse = |extra: &[&str]| {
            let mut args = vec!["knb", "rpc", "--stack", "luna"];
            args.extend_from_slice(extra);
            Cli::try_parse_from(args)
        };
        let Ok(Cli { cmd: Cmd::Rpc(a) }) = parse(&[]) else {
            panic!("plain rpc parses")
        };
        assert_eq!(a.wait_near, 0.0);
        let Ok(Cli { cmd: Cmd::Rpc(a) }) = parse(&["--wait-near", "60"]) else {
            panic!("--wait-near 60 parses")
        };
        assert_eq!(a.wait_near, 60.0);
        for bad in ["-1", "3601", "NaN", "soon"] {
            let arg = format!("--wait-near={bad}");
            let e = parse(&[&arg]).err().expect(bad).to_string();
            assert!(e.contains("between 0 and 3600"), "{bad}: {e}");
        }
        assert!(
            Cli::try_parse_from(["knb", "bulk", "--stack", "kernel", "--wait-near", "5"]).is_ok()
        );
    }
}

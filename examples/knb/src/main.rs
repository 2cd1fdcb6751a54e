//! knb: RPC load tester and benchmark driver.
#![forbid(unsafe_code)]

fn main() {
    eprintln!("knb: no subcommand is implemented yet");
    std::process::exit(2);
}

//! `msgsim`: the queueing simulator's command line (not written yet).
fn main() {
    eprintln!("msgsim: not implemented yet");
    std::process::exit(2);
}

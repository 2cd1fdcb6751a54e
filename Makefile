# luna: build, test and demo entry points. `make demo` and `make test` are the two commands
# a fresh Debian bookworm machine needs (as root); both run `setup` first.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
CARGO ?= cargo

# Name prefix of everything the testbed creates for the demo and clean-testbed.
export LUNA_TESTBED_PREFIX ?= luna
# Extra arguments for both `knb compare` runs of the demo (DEMO_ROUNDS, DEMO_DURATION
# in the environment bound its length).
KNB_DEMO_ARGS ?=

# Test suites run by `make test`, in order. Later suites (fuzz smoke runs, integration
# suites) add a `test-<name>` target below and append it here.
TEST_SUITES := test-workspace test-loom test-fuzz test-dpdk-compat

# Seconds per fuzz target in `make test-fuzz` (15 targets: luna-stack's 9, bifurcation's 1,
# msgsched's 5; the builds are most of the cost).
FUZZ_SECS ?= 6

.PHONY: help setup build test $(TEST_SUITES) interop attack attack-proto soak lint demo bench knb-pgo figures msgsched-sweep clean-testbed preload preload-demo

help:
	@echo "make setup          install packages, reserve hugepages (root)"
	@echo "make build          cargo build --workspace --all-targets"
	@echo "make test           setup, then: $(TEST_SUITES) (root)"
	@echo "make interop        setup, then the full-size kernel interop run (docs/interop.md; root)"
	@echo "make attack         setup, then the attack suite against a luna server over tap, a p99 verdict per attack against interleaved baselines (docs/reliability.md; root, quiet machine)"
	@echo "make attack-proto   setup, then the good client's p50/p99/p99.9 under each HTTP/2 and memcached attack against interleaved baselines, attacker at normal and idle priority, a verdict per attack (r2c/tests/attack_bench.sh; ATTACK_PROTO_SERVER=kernel: nghttpd / memcached as the control; docs/reliability.md; root, quiet machine)"
	@echo "make soak           setup, then the full soak: 10 GiB + 10 M RPCs luna<->luna, a kernel share over tap (docs/reliability.md; root)"
	@echo "make lint           rustfmt check + clippy -D warnings"
	@echo "make demo           setup, then knb compare: luna vs kernel vs smoltcp vs raw, 4 KiB RPCs (root)"
	@echo "make bench          luna-stack per-segment and bulk per-byte cost: callgrind instructions vs docs/bench/ + criterion (a report, never fails on a number)"
	@echo "make knb-pgo        setup, then knb with profile-guided optimisation, trained on luna and smoltcp alike: target/pgo/release/knb (~5 min; root; docs/benchmarks.md)"
	@echo "make figures        setup, then regenerate docs/fig9-12 (knb sweep: kernel, smoltcp, luna, copy + zero-copy memif; ~10 min; root, quiet machine)"
	@echo "make msgsched-sweep luna's CP/CS/MS vs the kernel's CP/CS/pool under an SLO, 100/20 us bimodal, 20/5000 conns, vs the simulator's ideal (~25 min; root, quiet machine)"
	@echo "make clean-testbed  remove every namespace/interface/file with prefix $(LUNA_TESTBED_PREFIX)"
	@echo "make preload        build the LD_PRELOAD shim target/release/libluna-preload.so (ffi/preload)"
	@echo "make preload-demo   setup, then unmodified redis-server on luna via LD_PRELOAD, redis-benchmark against it (root)"

setup:
	bash testbed/setup.sh

build:
	$(CARGO) build --workspace --all-targets

test: setup
	$(MAKE) --no-print-directory $(TEST_SUITES)

# Unit and testbed integration tests of every crate (the testbed's need root). Includes the
# reduced kernel interop run (r2c/tests/interop_kernel.rs, about a minute) and the reduced
# soak (r2c/tests/soak.rs: soak_luna_luna_reduced, soak_luna_kernel_reduced, about 30 s).
# The packetdrill scripts and the generated corpus run once, in `pass_counts`, alone and
# with its output shown: passed / failed / skipped / expected-fail per directory.
test-workspace:
	$(CARGO) test --workspace -- --skip pass_counts
	$(CARGO) test -p luna-stack --test packetdrill pass_counts -- --nocapture

# loom models of msgsched's cross-thread protocols (the scheduler's handoff/steal/park,
# the reply path's transmit delegation and the I/O core's wakeable idle sleep), bounded by
# their preemption limits. Own target directory: `--cfg loom` would otherwise rebuild the
# workspace's cache.
test-loom:
	RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom $(CARGO) test -p msgsched --release --test loom_reply --test loom_sched --test loom_wake

# dpdk-sys must build against other DPDK releases without source changes (bindgen at
# build time): cargo check over Debian trixie's DPDK 24.11 headers.
test-dpdk-compat:
	bash ffi/dpdk/compat-check.sh

# Fuzz smoke run: build every luna-stack cargo-fuzz target and run each for FUZZ_SECS with
# the committed seeds, then bifurcation's classifier target and msgsched's protocol
# targets (installs cargo-fuzz if missing). cargo-fuzz needs the nightly toolchain, which
# a fresh machine cannot download: without it the suite is skipped with a message, never
# silently.
test-fuzz:
	@if ! command -v rustup >/dev/null 2>&1 || ! rustup run nightly rustc --version >/dev/null 2>&1; then \
		echo "test-fuzz: SKIPPED: the nightly Rust toolchain is not installed (cargo-fuzz needs it; rustup toolchain install nightly)"; \
	else \
		bash luna-stack/fuzz/run-bounded.sh $(FUZZ_SECS) && \
		bash bifurcation/fuzz/run-bounded.sh $(FUZZ_SECS) && \
		bash msgsched/fuzz/run-bounded.sh $(FUZZ_SECS); \
	fi

# TCP interoperability with the Linux kernel, full size (docs/interop.md): 1 GiB bulk and
# 100,000 pipelined 4 KiB RPCs with luna as client and as server, 2% loss, 25% reordering
# and 1% duplication both ways, tshark over the capture. About half an hour on this machine.
interop: setup
	$(CARGO) test -p r2c --test interop_kernel -- --ignored --exact lio_kernel_interop_full --nocapture

# Attack suite (docs/reliability.md): scapy from the tap's kernel namespace against a luna
# server while a legitimate client keeps doing RPCs; each of the 13 attacks between two
# baselines of its own, LUNA_ATTACK_REPS (3) times, phases of LUNA_ATTACK_SECS (3) s: 79
# phases, about 4.5 min; a p99 verdict per attack ("Interleaved baselines and the
# verdict"), and the server's drops by reason and memory high-water marks per phase. A
# reduced run (8 attacks, 1 repetition of 1 s phases) is part of `make test`.
# ATTACK_SERVER=kernel: the same against the kernel's TCP (veth topology, SYN cookies
# forced), the control. Attacker, client and sniffer are pinned to CPU 1 by default
# (luna's poller: CPU 0; LUNA_ATTACK_PIN=0 unpins), LUNA_ATTACK_NICE=idle runs the
# attacker at SCHED_IDLE, LUNA_ATTACK_SPIN=1 keeps CPU 1 from idling (a SCHED_IDLE spinner);
# LUNA_ATTACK_REPS=0 is the earlier sequential run.
attack: setup
	$(CARGO) test -p r2c --test dpdk_runtime -- --ignored --exact tap_attack_full --nocapture

# Protocol attacks, the timing side (docs/reliability.md, "The good client's p99 under
# protocol attacks"): luna-h2 and luna-kv over tap, a checked good client through every
# phase, each HTTP/2 / memcached attack at each attacker priority (normal, SCHED_IDLE)
# between two baselines of its own, REPS (3) times, SECS (3) s phases, driver and attackers
# on CPU 1 (SPIN=1: a SCHED_IDLE spinner keeps that CPU from idling); a p99 verdict per
# attack. About 12 minutes. A benchmark (verdicts reported,
# fails only on behaviour); `r2c/tests/attack_bench.sh tiny` checks it runs.
# ATTACK_PROTO_SERVER=kernel: the same phases against Debian's nghttpd and memcached on the
# kernel's TCP (veth topology, server on CPU 0), the control; only good-client errors fail.
attack-proto: setup
	r2c/tests/attack_bench.sh

# Soak (docs/reliability.md, `## Soak`): luna<->luna over an in-memory link with an
# impairment device (two profiles, 1% and 5% loss, duplication, 0.1% corruption, reordering,
# delay with jitter: 10 GiB and 10 M RPCs in all), then luna<->kernel over tap through the
# NFQUEUE engine with delay and jitter (256 MiB each way and 50,000 RPCs per role). Every
# byte checked end to end. Release build; one test at a time.
soak: setup
	$(CARGO) test --release -p r2c --test soak -- --ignored --exact --test-threads=1 --nocapture \
		soak_luna_luna_full soak_luna_kernel_full

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

demo: setup
	bash testbed/demo.sh $(KNB_DEMO_ARGS)

# luna-stack's per-segment cost (RX/TX, 64 B/1460 B/4 KiB, luna vs smoltcp): instructions per
# segment under callgrind against the record in docs/bench/stack-instructions.json, then
# bulk instructions per byte (one flow, MTU 1500 and 9000, luna vs smoltcp) against
# docs/bench/bulk-instructions.json, then criterion wall clock against the last run here
# (indicative). BENCH_RECORD=1 updates the records, BENCH_BULK=0 skips the bulk counts,
# BENCH_WALL=0 skips criterion.
# docs/benchmarks.md ("make bench").
bench:
	bash luna-stack/benches/make-bench.sh

# knb built with a profile of its own runs (luna and smoltcp trained alike): the hot code
# laid out hot/cold, a quarter fewer hot cache lines (docs/benchmarks.md, "Profile-guided
# build"). rustup's llvm-tools are installed by the script.
knb-pgo: setup
	examples/knb/pgo-build.sh

# LUNA's figures 9-12 with luna (docs/fig9-msgsize, fig10-iodepth(-p99), fig11-cdf,
# fig12-cores, figs-claims.csv): knb sweep over kernel, smoltcp and luna, the memif stacks in
# copy and zero-copy mode; prints how long it took (about 10 minutes). Root; run it on a
# quiet machine. FIG_* knobs in examples/knb/figures.sh.
figures: setup
	bash examples/knb/figures.sh

# msgsched on the real stack against the kernel baselines, one command (issue 9): knb's SLO
# sweep of luna's CP/CS/MS and of the kernel's TCP-CP/TCP-CS/worker pool, 100 us and 20 us
# bimodal service, 20 and 5,000 connections, with the simulator's ideal MS; prints one table
# (throughput under SLO, fraction of ideal, MS-on-luna / each kernel model). About 25
# minutes; root; quiet machine. SWEEP_* knobs in examples/knb/msgsched-sweep.sh.
msgsched-sweep: setup
	bash examples/knb/msgsched-sweep.sh

clean-testbed:
	$(CARGO) run -q -p testbed -- down --prefix $(LUNA_TESTBED_PREFIX)

# Change -> visible-on-every-reader latency of `ip route/neigh` changes over 1,000 changes
# (docs/netlink-sync.md; root). Run on a quiet machine; prints p50/p90/p99/max.
.PHONY: nl-latency
nl-latency:
	$(CARGO) run -p netlink-sync --release --bin nl-latency -- --changes 1000

# The same through r2c's cores: change -> in every core's stack (its published
# exc_table_version), 1,000 changes, 2 cores (NL_CHANGES, NL_CORES); root.
.PHONY: nl-latency-r2c
nl-latency-r2c:
	$(CARGO) test -p r2c --release --test mirror_cores nl_latency_r2c -- --ignored --nocapture
# The LD_PRELOAD shim (ffi/preload/README.md): cargo names the cdylib libluna_preload.so;
# the docs' name is a link to it.
preload:
	$(CARGO) build --release -p luna-preload
	ln -sf libluna_preload.so $${CARGO_TARGET_DIR:-target}/release/libluna-preload.so

preload-demo: setup
	$(CARGO) test -p luna-preload --test redis -- --nocapture

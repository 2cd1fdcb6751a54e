//! Tables, CSV and JSON files.

use std::path::Path;

use serde_json::{Map, Value};

use crate::run::Output;
use crate::workload::{Error, Res};

fn f(v: &Value) -> String {
    match v.as_f64() {
        Some(x) if x >= 1000.0 => format!("{x:.0}"),
        Some(x) if x >= 10.0 => format!("{x:.1}"),
        Some(x) => format!("{x:.3}"),
        None => "-".into(),
    }
}

/// Prints one line per run report.
pub fn print_table(rows: &[Value]) {
    println!(
        "{:<8} {:<4} {:>7} {:>7} {:>5} {:>5} {:>3} {:>10} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9} {:>6} {:>6}",
        "stack", "mode", "req B", "resp B", "depth", "conns", "thr", "RPC/s", "Gbit/s", "c->s", "s->c",
        "p50 us", "p90 us", "p99 us", "p99.9 us", "cpu C", "cpu S"
    );
    for r in rows {
        let c = &r["config"];
        let lat = &r["latency_us"];
        let mode = c["mode"].as_str().unwrap_or("?");
        println!(
            "{:<8} {:<4} {:>7} {:>7} {:>5} {:>5} {:>3} {:>10} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9} {:>6} {:>6}",
            r["stack"].as_str().unwrap_or("?"),
            mode,
            c["req_size"].to_string(),
            c["resp_size"].to_string(),
            c["iodepth"].to_string(),
            c["connections"].to_string(),
            c["threads"].to_string(),
            f(&r["rps"]),
            f(&r["gbps"]["total"]),
            f(&r["gbps"]["client_to_server"]),
            f(&r["gbps"]["server_to_client"]),
            f(&lat["p50"]),
            f(&lat["p90"]),
            f(&lat["p99"]),
            f(&lat["p999"]),
            f(&r["cpu"]["client"]["cores"]),
            f(&r["cpu"]["server"]["cores"]),
        );
        if let Some(b) = r["bulk"].as_object() {
            println!(
                "  bulk: receiver {} Gbit/s, sender {} Gbit/s, {} payload bytes sent, all received: {}",
                f(&b["receiver_gbps"]),
                f(&b["sender_gbps"]),
                b["payload_sent"],
                b["validated"]
            );
        }
        if let Some(d) = drops_line(r) {
            println!("  {d}");
        }
        if let Some(l) = crate::stalls::line(r) {
            println!("  {l}");
        }
        if let Some(l) = crate::stalls::phases_line(r) {
            println!("  {l}");
        }
        if let Some(c) = contention_line(r) {
            println!("  {c}");
        }
        if let Some(h) = crate::hostlink::describe(r) {
            println!("  {h}");
        }
        if let Some(o) = r["open_loop"].as_object() {
            println!(
                "  open loop: offered {} RPC/s, achieved {} RPC/s, {} arrivals dropped",
                f(&o["offered_rps"]),
                f(&o["achieved_rps"]),
                o["dropped_arrivals"]
            );
            // Honesty counters (wrk2 / Perséphone): latency from the scheduled send time.
            if o.contains_key("sent") {
                println!(
                    "  open loop honesty: p50/p99/p99.9 {}/{}/{} us at achieved {} RPC/s (offered {}); \
                     {} sent, {} behind schedule (>{} us, max lag {} us), {} sent-not-answered, \
                     {} never sent",
                    f(&o["p50_us"]),
                    f(&o["p99_us"]),
                    f(&o["p999_us"]),
                    f(&o["achieved_rps"]),
                    f(&o["offered_rps"]),
                    o["sent"],
                    o["behind_schedule"],
                    f(&o["behind_schedule_threshold_us"]),
                    f(&o["max_send_lag_us"]),
                    o["sent_not_answered"],
                    o["unsent_at_end"]
                );
            }
        }
    }
}

/// Adds the `{reason: count}` objects under `key` of each backend `extra` in `extras`.
fn sum_reasons<'a>(extras: impl Iterator<Item = &'a Value>, key: &str) -> Map<String, Value> {
    let mut m = Map::new();
    for e in extras {
        for (k, v) in e[key].as_object().into_iter().flatten() {
            let n = m.get(k).and_then(Value::as_u64).unwrap_or(0) + v.as_u64().unwrap_or(0);
            m.insert(k.clone(), n.into());
        }
    }
    m
}

fn reasons(m: &Map<String, Value>) -> String {
    if m.is_empty() {
        return "none".into();
    }
    m.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// `drops: server stack no_socket=3 tcp none; client stack none tcp out_of_window=5` for
/// runs whose backend reports drops by reason (luna), else None.
pub fn drops_line(r: &Value) -> Option<String> {
    let server = std::slice::from_ref(&r["server"]["extra"]);
    let client = r["client_extra"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    let mut parts = Vec::new();
    for (side, extras) in [("server", server), ("client", client)] {
        if !extras
            .iter()
            .any(|e| e.get("stack_drops_by_reason").is_some())
        {
            continue;
        }
        parts.push(format!(
            "{side} stack {} tcp {}",
            reasons(&sum_reasons(extras.iter(), "stack_drops_by_reason")),
            reasons(&sum_reasons(extras.iter(), "tcp_drops_by_reason"))
        ));
    }
    (!parts.is_empty()).then(|| format!("drops: {}", parts.join("; ")))
}

/// `round: clean; per poller CPU client 0.99 server 0.97; involuntary switches client 40
/// server 3; host steal 0.0%` from a run's `contention` (None when it has none).
pub fn contention_line(r: &Value) -> Option<String> {
    let c = r.get("contention").filter(|c| c.is_object())?;
    let verdict = if c["contended"] == Value::Bool(true) {
        let why: Vec<&str> = c["reasons"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        format!("CONTENDED ({})", why.join("; "))
    } else {
        "clean".into()
    };
    let n = |v: &Value| v.as_u64().map_or("-".into(), |x| x.to_string());
    let steal = c["steal"]
        .as_f64()
        .map_or("-".into(), |x| format!("{:.1}%", x * 100.0));
    Some(format!(
        "round: {verdict}; CPU per poller client {} server {}; involuntary switches client {} \
         server {}; host steal {steal}",
        f(&c["client_cpu"]),
        f(&c["server_cpu"]),
        n(&c["nvcsw"]["client"]),
        n(&c["nvcsw"]["server"]),
    ))
}

/// CSV columns, in order.
pub const CSV_HEADER: &str = "stack,mode,req_size,resp_size,iodepth,connections,threads,rate,duration_s,rpcs,rps,gbps_total,gbps_c2s,gbps_s2c,p50_us,p90_us,p99_us,p999_us,max_us,cpu_client,cpu_server,bulk_receiver_gbps,bulk_sender_gbps,contended,unstable,steal,nvcsw_client,nvcsw_server,host_link,host_link_before_ns,host_link_after_ns";

fn cell(v: &Value) -> String {
    match v {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        other => other.to_string(),
    }
}

/// One CSV row of a run report.
pub fn csv_row(r: &Value) -> String {
    let c = &r["config"];
    let l = &r["latency_us"];
    [
        &r["stack"],
        &c["mode"],
        &c["req_size"],
        &c["resp_size"],
        &c["iodepth"],
        &c["connections"],
        &c["threads"],
        &c["rate"],
        &r["duration_s"],
        &r["rpcs"],
        &r["rps"],
        &r["gbps"]["total"],
        &r["gbps"]["client_to_server"],
        &r["gbps"]["server_to_client"],
        &l["p50"],
        &l["p90"],
        &l["p99"],
        &l["p999"],
        &l["max"],
        &r["cpu"]["client"]["cores"],
        &r["cpu"]["server"]["cores"],
        &r["bulk"]["receiver_gbps"],
        &r["bulk"]["sender_gbps"],
        &r["contention"]["contended"],
        &r["contention"]["unstable"],
        &r["contention"]["steal"],
        &r["contention"]["nvcsw"]["client"],
        &r["contention"]["nvcsw"]["server"],
        &r["host_link"]["mode"],
        &r["host_link"]["before_ns"],
        &r["host_link"]["after_ns"],
    ]
    .iter()
    .map(|v| cell(v))
    .collect::<Vec<_>>()
    .join(",")
}

/// Writes `text` to `path` with a clear error.
pub fn write_file(path: &Path, text: &str) -> Res<()> {
    std::fs::write(path, text)
        .map_err(|e| Error::Run(format!("cannot write {}: {e}", path.display())))
}

/// Writes `--json` (the document `doc`) and `--csv` (one row per run in `rows`).
pub fn write_outputs(out: &Output, doc: &Value, rows: &[Value]) -> Res<()> {
    if let Some(p) = &out.json {
        let text = serde_json::to_string_pretty(doc).map_err(|e| Error::Run(e.to_string()))?;
        write_file(p, &(text + "\n"))?;
    }
    if let Some(p) = &out.csv {
        let mut s = String::from(CSV_HEADER);
        s.push('\n');
        for r in rows {
            s.push_str(&csv_row(r));
            s.push('\n');
        }
        write_file(p, &s)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn drops_line_names_reasons_per_side() {
        let r = json!({
            "server": {"extra": {"stack_drops": 3, "stack_drops_by_reason": {"no_socket": 3},
                "tcp_drops_by_reason": {}}},
            "client_extra": [
                {"stack_drops_by_reason": {}, "tcp_drops_by_reason": {"out_of_window": 2}},
                {"stack_drops_by_reason": {"malformed": 1},
                 "tcp_drops_by_reason": {"out_of_window": 3, "paws": 1}},
            ],
        });
        assert_eq!(
            drops_line(&r).as_deref(),
            Some(
                "drops: server stack no_socket=3 tcp none; \
                 client stack malformed=1 tcp out_of_window=5 paws=1"
            )
        );
        // Backends without the breakdown (kernel, smoltcp): no line.
        assert_eq!(
            drops_line(&json!({"server": {"extra": null}, "client_extra": []})),
            None
        );
    }

    #[test]
    fn csv_rows_match_the_header() {
        let r = json!({"stack": "kernel", "config": {"mode": "rpc", "req_size": 4096, "rate": null},
            "rps": 1234.5, "latency_us": {"p99": 51.0}});
        let row = csv_row(&r);
        assert_eq!(
            row.split(',').count(),
            CSV_HEADER.split(',').count(),
            "{row}"
        );
        assert!(row.starts_with("kernel,rpc,4096,"), "{row}");
        assert!(row.contains(",1234.5,"), "{row}");
    }
}

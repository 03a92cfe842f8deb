//! For scripts/bench-dbus.sh: `getstatus_latency DIR CLIENTS CALLS` — CLIENTS threads, each with
//! its own connection to the system bus (DBUS_SYSTEM_BUS_ADDRESS), call GetStatus(DIR) CALLS
//! times; prints each call's latency in nanoseconds, one per line (errors count as calls and
//! are reported on stderr).
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, dir, clients, calls] = &args[..] else {
        eprintln!("usage: getstatus_latency DIR CLIENTS CALLS");
        std::process::exit(2);
    };
    let (clients, calls): (usize, usize) = (clients.parse().expect("CLIENTS"), calls.parse().expect("CALLS"));
    let threads: Vec<_> = (0..clients)
        .map(|_| {
            let dir = dir.clone();
            std::thread::spawn(move || {
                let conn = zbus::blocking::Connection::system().expect("system bus");
                let mut out = Vec::with_capacity(calls);
                for _ in 0..calls {
                    let t = Instant::now();
                    let r = conn.call_method(
                        Some("org.dirseal.Dirseal1"),
                        "/org/dirseal/Dirseal1",
                        Some("org.dirseal.Dirseal1"),
                        "GetStatus",
                        &(dir.as_str(),),
                    );
                    out.push(t.elapsed().as_nanos());
                    if let Err(e) = r {
                        eprintln!("GetStatus: {e}");
                    }
                }
                out
            })
        })
        .collect();
    for t in threads {
        for ns in t.join().expect("client thread") {
            println!("{ns}");
        }
    }
}

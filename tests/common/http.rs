//! A relay process's operator endpoint (`/metrics`, `/healthz`, `/readyz`), read over plain HTTP.

use std::io::{Read, Write};
use std::time::Duration;

/// `GET path` on `addr`: (status code, body); `None` if nothing listens.
pub fn get(addr: &str, path: &str) -> Option<(u16, String)> {
    let mut stream = std::net::TcpStream::connect(addr).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let status = response.split(' ').nth(1)?.parse().ok()?;
    let body = response.split_once("\r\n\r\n")?.1.to_string();
    Some((status, body))
}

/// `127.0.0.1:PORT` with a port free right now, for a relay's `--metrics-listen`: below the
/// kernel's range for outgoing connections (as the harness picks its servers' ports), so no
/// client socket of the many the tests open takes it before the relay binds it (the relay then
/// exits: "cannot listen on metrics.listen").
pub fn free_addr() -> String {
    let port = outbox_devenv::process::free_port().expect("a free loopback port");
    format!("127.0.0.1:{port}")
}

/// Waits (up to a minute) until `/readyz` on `addr` answers 503 with `topic` as the one refused
/// topic; returns that body.
pub async fn wait_until_refused(addr: &str, topic: &str) -> String {
    let listed = format!("\"refused_topics\":[\"{topic}\"]");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        match get(addr, "/readyz") {
            Some((503, body)) if body.contains(&listed) => return body,
            other => assert!(
                std::time::Instant::now() < deadline,
                "/readyz did not name {topic} as refused within 60 s: {other:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

//! One HTTP/1.1 call to the filter's admin listener (loopback, plain HTTP: the listener is never
//! exposed beyond the host). Small on purpose, as `resp.rs`: the tool makes one call per run.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// `http://host:port` of the admin listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub host: String,
    pub port: u16,
}

impl Target {
    pub fn parse(url: &str) -> Result<Target, String> {
        let rest =
            url.strip_prefix("http://").ok_or("expected http://host:port (the admin listener; https is not served)")?;
        let hostport = rest.trim_end_matches('/');
        let (host, port) = hostport.rsplit_once(':').ok_or("expected http://host:port")?;
        let port = port.parse::<u16>().map_err(|_| format!("port {port:?} is not a number 0-65535"))?;
        if host.is_empty() || host.contains('/') {
            return Err("expected http://host:port".into());
        }
        Ok(Target { host: host.to_string(), port })
    }
}

/// The answer: status and body.
pub struct Answer {
    pub status: u16,
    pub body: Vec<u8>,
}

/// `method path` with the bearer secret and an optional JSON body.
pub fn call(t: &Target, method: &str, path: &str, secret: &str, body: Option<&[u8]>) -> Result<Answer, String> {
    let addr = (t.host.as_str(), t.port)
        .to_socket_addrs()
        .map_err(|e| e.to_string())?
        .next()
        .ok_or_else(|| format!("{} does not resolve", t.host))?;
    let timeout = Duration::from_secs(10);
    let mut stream = TcpStream::connect_timeout(&addr, timeout).map_err(|e| e.to_string())?;
    stream.set_read_timeout(Some(timeout)).map_err(|e| e.to_string())?;
    let body = body.unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nhost: {}:{}\r\nauthorization: Bearer {secret}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        t.host,
        t.port,
        body.len()
    );
    stream.write_all(head.as_bytes()).and_then(|_| stream.write_all(body)).map_err(|e| e.to_string())?;
    // Read until the answer is whole, not until the connection closes: Envoy keeps it open for
    // its delayed-close timeout (1 s) after answering.
    let mut raw = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        if let Some(answer) = whole(&raw)? {
            return Ok(answer);
        }
        match stream.read(&mut buf).map_err(|e| e.to_string())? {
            0 => return parse(&raw),
            n => raw.extend_from_slice(buf.get(..n).unwrap_or_default()),
        }
    }
}

/// The answer once `raw` holds all of it (its `content-length`, or a chunked body's last chunk).
fn whole(raw: &[u8]) -> Result<Option<Answer>, String> {
    let Some(split) = raw.windows(4).position(|w| w == b"\r\n\r\n") else {
        return Ok(None);
    };
    let head = String::from_utf8_lossy(raw.get(..split).unwrap_or_default()).to_ascii_lowercase();
    let body_len = raw.len() - split - 4;
    let length = head.split("\r\n").find_map(|l| l.strip_prefix("content-length:")).map(|v| v.trim().parse::<usize>());
    match length {
        Some(Ok(n)) if body_len >= n => parse(raw.get(..split + 4 + n).unwrap_or_default()).map(Some),
        Some(_) => Ok(None),
        None if head.contains("transfer-encoding: chunked") && raw.ends_with(b"0\r\n\r\n") => parse(raw).map(Some),
        None => Ok(None),
    }
}

fn parse(raw: &[u8]) -> Result<Answer, String> {
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").ok_or("an incomplete HTTP answer")?;
    let head = String::from_utf8_lossy(raw.get(..split).unwrap_or_default());
    let rest = raw.get(split + 4..).unwrap_or_default();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or("an HTTP answer without a status")?;
    let chunked = lines.any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    let body = if chunked { dechunk(rest)? } else { rest.to_vec() };
    Ok(Answer { status, body })
}

fn dechunk(mut rest: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    loop {
        let end = rest.windows(2).position(|w| w == b"\r\n").ok_or("a cut chunked body")?;
        let size_line = String::from_utf8_lossy(rest.get(..end).unwrap_or_default()).into_owned();
        let size = usize::from_str_radix(size_line.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|_| format!("a bad chunk size {size_line:?}"))?;
        if size == 0 {
            return Ok(out);
        }
        let chunk = rest.get(end + 2..end + 2 + size).ok_or("a cut chunked body")?;
        out.extend_from_slice(chunk);
        rest = rest.get(end + 4 + size..).unwrap_or_default();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn answers_are_read_plain_and_chunked() {
        let a = parse(b"HTTP/1.1 409 Conflict\r\ncontent-length: 2\r\n\r\n{}").unwrap();
        assert_eq!((a.status, a.body), (409, b"{}".to_vec()));
        let a =
            parse(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n[1,\r\n2\r\n2]\r\n0\r\n\r\n").unwrap();
        assert_eq!((a.status, a.body), (200, b"[1,2]".to_vec()));
        assert!(parse(b"HTTP/1.1 200 OK\r\n").is_err());
        assert!(whole(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n[1,").unwrap().is_none());
        assert_eq!(whole(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n[]").unwrap().unwrap().body, b"[]");
    }

    #[test]
    fn only_plain_http_host_and_port() {
        assert_eq!(Target::parse("http://127.0.0.1:9901/").unwrap(), Target { host: "127.0.0.1".into(), port: 9901 });
        for bad in ["https://h:1", "http://h", "http://:1", "http://h:x", "http://h:1/path"] {
            assert!(Target::parse(bad).is_err(), "{bad}");
        }
    }
}

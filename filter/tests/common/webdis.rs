//! A real `redis-server` behind a real Webdis (Debian's packages; `examples/webdis.json` with its
//! ports rewritten), for the tests that send the filter's exact Webdis calls.

use idem_filter::store::redis::{command, Command};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command as Process, Stdio};
use std::time::{Duration, Instant};

const REDIS_PASSWORD: &str = "idem-redis-password";
const WEBDIS_AUTH: &str = "idem:idem-webdis-password";

/// redis-server and Webdis on free loopback ports, stopped when dropped.
pub struct Live {
    children: Vec<Child>,
    pub webdis_port: u16,
    _dir: PathBuf,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn binary(name: &str) -> String {
    for dir in std::env::var("PATH").unwrap_or_default().split(':').chain(["/usr/bin", "/usr/sbin"]) {
        let p = Path::new(dir).join(name);
        if p.is_file() {
            return p.to_string_lossy().into_owned();
        }
    }
    panic!("{name} not found: run `make setup` (it installs Debian's redis-server and webdis)");
}

impl Live {
    /// Starts both on fresh ports. A free port is only free when it was asked for: another test
    /// (these run on parallel threads) may take it before redis-server or Webdis binds it. So a
    /// pair that exits, or does not answer within 10 s, is stopped and started again on other
    /// ports (three tries); the last failure names the ports and the tail of Webdis's log.
    pub fn start(tag: &str) -> Live {
        let dir = std::env::temp_dir().join(format!("idem-owner-checks-{}-{tag}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut failures = Vec::new();
        for _ in 0..3 {
            match Live::try_start(&dir) {
                Ok(live) => return live,
                Err(why) => failures.push(why),
            }
        }
        let log = std::fs::read_to_string(dir.join("webdis.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        let tail = &lines[lines.len().saturating_sub(10)..];
        panic!("redis-server and webdis did not come up in three tries: {failures:?}; webdis.log ends with {tail:?}");
    }

    fn try_start(dir: &Path) -> Result<Live, String> {
        let redis_port = free_port();
        let redis = Process::new(binary("redis-server"))
            .args(["--port", &redis_port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--requirepass", REDIS_PASSWORD])
            .arg("--dir")
            .arg(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let webdis_port = free_port();
        let template = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/webdis.json");
        let mut cfg: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(template).unwrap()).unwrap();
        cfg["redis_port"] = redis_port.into();
        cfg["http_port"] = webdis_port.into();
        cfg["logfile"] = dir.join("webdis.log").to_string_lossy().into_owned().into();
        let cfg_path = dir.join("webdis.json");
        std::fs::write(&cfg_path, cfg.to_string()).unwrap();
        let webdis =
            Process::new(binary("webdis")).arg(&cfg_path).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
        // Dropped on failure: both children are stopped.
        let mut live = Live { children: vec![redis, webdis], webdis_port, _dir: dir.to_path_buf() };
        // Webdis answers 503 until each connection of its pool (16) has reached Redis: ready once
        // twice that many calls in a row succeeded.
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut in_a_row = 0;
        while in_a_row < 32 {
            match live.try_call(&command(&["SET", "idem:probe", "1"])) {
                Ok((200, body)) if body.contains("true") => in_a_row += 1,
                _ => {
                    in_a_row = 0;
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
            if let Some(why) = live.exited() {
                return Err(format!("{why} on redis port {redis_port}, webdis port {webdis_port}"));
            }
            if Instant::now() >= deadline {
                return Err(format!("no answer within 10 s on redis port {redis_port}, webdis port {webdis_port}"));
            }
        }
        // Answers may have come from another test's Webdis that took the port first (they share
        // credentials): ours then exits on its failed bind, seen here or on the next try.
        std::thread::sleep(Duration::from_millis(20));
        match live.exited() {
            Some(why) => Err(format!("{why} on redis port {redis_port}, webdis port {webdis_port}")),
            None => Ok(live),
        }
    }

    /// Which of redis-server and Webdis has exited, and how (a failed bind exits).
    fn exited(&mut self) -> Option<String> {
        let names = ["redis-server", "webdis"];
        names.iter().zip(self.children.iter_mut()).find_map(|(name, child)| match child.try_wait() {
            Ok(Some(status)) => Some(format!("{name} exited ({status})")),
            _ => None,
        })
    }

    pub fn try_call(&self, body: &str) -> std::io::Result<(u16, String)> {
        let mut conn = TcpStream::connect(("127.0.0.1", self.webdis_port))?;
        conn.set_read_timeout(Some(Duration::from_secs(5)))?;
        let auth = base64_basic(WEBDIS_AUTH);
        let request = format!(
            "POST / HTTP/1.1\r\nHost: webdis\r\nAuthorization: Basic {auth}\r\nContent-Type: text/plain\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        conn.write_all(request.as_bytes())?;
        let mut raw = String::new();
        conn.read_to_string(&mut raw)?;
        let status = raw.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
        let body = raw.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
        Ok((status, body))
    }

    /// Sends one of the filter's commands; its HTTP status and body, as the filter reads them.
    pub fn send(&self, cmd: &Command) -> (u16, Vec<u8>) {
        let (status, body) = self.try_call(&cmd.body).unwrap();
        (status, body.into_bytes())
    }

    /// The value of a key (through a script, as Webdis only allows SET and EVAL).
    pub fn get(&self, key: &str) -> Option<String> {
        let (_, body) = self.try_call(&command(&["EVAL", "return redis.call('GET',KEYS[1])", "1", key])).unwrap();
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        v["EVAL"].as_str().map(str::to_string)
    }

    /// The remaining life of a key in ms (-2 when absent).
    pub fn pttl(&self, key: &str) -> i64 {
        let (_, body) = self.try_call(&command(&["EVAL", "return redis.call('PTTL',KEYS[1])", "1", key])).unwrap();
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        v["EVAL"].as_i64().unwrap_or_else(|| panic!("PTTL reply {body}"))
    }

    pub fn del(&self, key: &str) {
        self.try_call(&command(&["EVAL", "return redis.call('DEL',KEYS[1])", "1", key])).unwrap();
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn base64_basic(s: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(s)
}

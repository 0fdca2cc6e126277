//! A Redis connection speaking RESP2 over TCP: enough for the operator's five commands (AUTH,
//! SELECT, SCAN, GET, EVAL). The `redis` crate would bring 35 crates (url, idna, ICU tables)
//! into every build for this; the protocol is a few lines.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// A Redis reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Nil,
    Int(i64),
    Bulk(Vec<u8>),
    Status(String),
    Array(Vec<Reply>),
}

impl Reply {
    pub fn int(&self) -> Option<i64> {
        match self {
            Reply::Int(n) => Some(*n),
            _ => None,
        }
    }

    /// A bulk or status reply as text; `None` for nil (and anything else).
    pub fn text(&self) -> Option<String> {
        match self {
            Reply::Bulk(b) => Some(String::from_utf8_lossy(b).into_owned()),
            Reply::Status(s) => Some(s.clone()),
            _ => None,
        }
    }
}

/// Where to connect and as whom: `redis://[user[:password]@]host[:port][/db]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub host: String,
    pub port: u16,
    pub user: Option<String>,
    pub password: Option<String>,
    pub db: u32,
}

impl Target {
    pub fn parse(url: &str) -> Result<Target, String> {
        let rest = url.strip_prefix("redis://").ok_or("expected redis://[user[:password]@]host[:port][/db]")?;
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let (creds, hostport) = match authority.rsplit_once('@') {
            Some((c, h)) => (Some(c), h),
            None => (None, authority),
        };
        let (user, password) = match creds {
            None => (None, None),
            Some(c) => match c.split_once(':') {
                Some((u, p)) => (Some(decode(u)?).filter(|u| !u.is_empty()), Some(decode(p)?)),
                None => (Some(decode(c)?), None),
            },
        };
        let (host, port) = match hostport.rsplit_once(':') {
            Some((h, p)) => (h, p.parse::<u16>().map_err(|_| format!("port {p:?} is not a number 0-65535"))?),
            None => (hostport, 6379),
        };
        if host.is_empty() {
            return Err("no host".into());
        }
        let db = match path {
            "" => 0,
            d => d.parse::<u32>().map_err(|_| format!("database {d:?} is not a number"))?,
        };
        Ok(Target { host: host.to_string(), port, user, password, db })
    }
}

/// `%XX` escapes of a URL's user or password.
fn decode(s: &str) -> Result<String, String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s.get(i + 1..i + 3).and_then(|h| u8::from_str_radix(h, 16).ok());
            out.push(hex.ok_or("a % in the credentials is not followed by two hex digits")?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| "the credentials are not UTF-8".to_string())
}

pub struct Connection {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

/// An error reply (`-ERR …`, `-NOPERM …`, `-WRONGPASS …`) or a broken connection.
#[derive(Debug)]
pub struct Error(pub String);

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error(e.to_string())
    }
}

impl Connection {
    /// Connects, authenticates and selects the database.
    pub fn open(t: &Target, timeout: Duration) -> Result<Connection, Error> {
        let addr = (t.host.as_str(), t.port)
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| Error(format!("{} does not resolve", t.host)))?;
        let stream = TcpStream::connect_timeout(&addr, timeout)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        let mut con = Connection { reader: BufReader::new(stream.try_clone()?), writer: stream };
        match (&t.user, &t.password) {
            (Some(user), Some(pw)) => con.call(&["AUTH", user, pw])?,
            (None, Some(pw)) => con.call(&["AUTH", pw])?,
            _ => Reply::Nil,
        };
        if t.db != 0 {
            con.call(&["SELECT", &t.db.to_string()])?;
        }
        Ok(con)
    }

    pub fn call(&mut self, args: &[&str]) -> Result<Reply, Error> {
        self.send(args)?;
        self.read()
    }

    /// Several commands sent at once (a pipeline), their replies in order.
    pub fn pipeline(&mut self, commands: &[Vec<&str>]) -> Result<Vec<Reply>, Error> {
        for c in commands {
            self.send(c)?;
        }
        commands.iter().map(|_| self.read()).collect()
    }

    fn send(&mut self, args: &[&str]) -> Result<(), Error> {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            out.extend_from_slice(a.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        Ok(self.writer.write_all(&out)?)
    }

    fn read(&mut self) -> Result<Reply, Error> {
        let mut line = Vec::new();
        self.reader.read_until(b'\n', &mut line)?;
        if !line.ends_with(b"\r\n") {
            return Err(Error("Redis closed the connection".into()));
        }
        line.truncate(line.len() - 2);
        let (kind, rest) = line.split_first().ok_or_else(|| Error("an empty reply line".into()))?;
        let rest = String::from_utf8_lossy(rest).into_owned();
        let number = || rest.parse::<i64>().map_err(|_| Error(format!("unreadable reply length {rest:?}")));
        match kind {
            b'+' => Ok(Reply::Status(rest)),
            b'-' => Err(Error(rest)),
            b':' => Ok(Reply::Int(number()?)),
            b'$' => match usize::try_from(number()?) {
                Err(_) => Ok(Reply::Nil),
                Ok(n) => {
                    let mut data = vec![0u8; n + 2];
                    self.reader.read_exact(&mut data)?;
                    data.truncate(n);
                    Ok(Reply::Bulk(data))
                }
            },
            b'*' => match usize::try_from(number()?) {
                Err(_) => Ok(Reply::Nil),
                Ok(n) => (0..n).map(|_| self.read()).collect::<Result<_, _>>().map(Reply::Array),
            },
            other => Err(Error(format!("unreadable reply type {:?}", char::from(*other)))),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn urls_name_the_user_the_password_and_the_database() {
        let t = Target::parse("redis://idem-operator:p%40ss%3Aw@127.0.0.1:6380/2").unwrap();
        assert_eq!(
            t,
            Target {
                host: "127.0.0.1".into(),
                port: 6380,
                user: Some("idem-operator".into()),
                password: Some("p@ss:w".into()),
                db: 2
            }
        );
        let t = Target::parse("redis://:secret@localhost").unwrap();
        assert_eq!((t.user, t.password, t.port, t.db), (None, Some("secret".into()), 6379, 0));
        for bad in ["http://x", "redis://", "redis://h:99999", "redis://h/x", "redis://u:%zz@h"] {
            assert!(Target::parse(bad).is_err(), "{bad}");
        }
    }
}

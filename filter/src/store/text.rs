//! Numbers and ids appended to the store's keys and records as `format!` writes them, without
//! its machinery or an allocation per piece: a Redis claim, a completion and a shared-store key
//! are built on every request.

/// Appends `n` in decimal, as `{n}` formats it.
pub(crate) fn push_decimal(out: &mut String, n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut rest = n;
    loop {
        at -= 1;
        digits[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    // ASCII digits: always UTF-8, appended in one copy.
    out.push_str(std::str::from_utf8(&digits[at..]).unwrap_or_default());
}

/// Appends `bytes` in lower-case hex, two digits each (`{:02x}` of each byte; of a big-endian
/// `u64`'s bytes, `{:016x}`).
pub(crate) fn push_hex(out: &mut String, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    out.reserve(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 15)]));
    }
}

#[cfg(test)]
mod tests {
    use super::{push_decimal, push_hex};

    #[test]
    fn decimals_are_written_as_format_writes_them() {
        for n in [0, 7, 10, 99, 4095, 1_000_000, u64::from(u32::MAX), 1_800_000_000_123, u64::MAX] {
            let mut out = String::from("b:");
            push_decimal(&mut out, n);
            assert_eq!(out, format!("b:{n}"));
        }
    }

    #[test]
    fn hex_is_written_as_format_writes_it() {
        for n in [0u64, 0xab, 0x0123_4567_89ab_cdef, u64::MAX] {
            let mut out = String::new();
            push_hex(&mut out, &n.to_be_bytes());
            assert_eq!(out, format!("{n:016x}"));
        }
        let bytes = [0x00, 0x0f, 0xf0, 0xff, 0x5a];
        let mut out = String::from("k:");
        push_hex(&mut out, &bytes);
        assert_eq!(out, "k:000ff0ff5a");
    }
}

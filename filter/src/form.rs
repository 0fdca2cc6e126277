//! Reading one field out of an `application/x-www-form-urlencoded` body (Alipay's async notify),
//! exactly: percent-decoded, `+` as a space, and a field sent twice is ambiguous — the gateway
//! and the merchant's framework could each take another one.

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FormError {
    /// The field is there more than once.
    Ambiguous,
    /// The decoded value is not UTF-8.
    NotUtf8,
}

/// The decoded value of field `name`, `Ok(None)` when the body has no such field.
pub fn field(body: &[u8], name: &str) -> Result<Option<String>, FormError> {
    let mut found: Option<Vec<u8>> = None;
    for pair in body.split(|&b| b == b'&').filter(|p| !p.is_empty()) {
        let (raw_name, raw_value) = match pair.iter().position(|&b| b == b'=') {
            Some(i) => (&pair[..i], &pair[i + 1..]),
            None => (pair, &pair[pair.len()..]),
        };
        if decode(raw_name) != name.as_bytes() {
            continue;
        }
        if found.is_some() {
            return Err(FormError::Ambiguous);
        }
        found = Some(decode(raw_value));
    }
    found.map(|v| String::from_utf8(v).map_err(|_| FormError::NotUtf8)).transpose()
}

/// `+` is a space and `%XX` a byte (the WHATWG URL-encoded parser); a `%` not followed by two
/// hex digits stays as it is.
fn decode(raw: &[u8]) -> Vec<u8> {
    let plus_as_space: Vec<u8> = raw.iter().map(|&b| if b == b'+' { b' ' } else { b }).collect();
    crate::policy::percent_decode(&plus_as_space)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_decoded_exactly() {
        let body = b"notify_id=ac05%2B99&out_trade_no=20150320010101001&subject=a+b%20c&empty=&flag";
        assert_eq!(field(body, "notify_id"), Ok(Some("ac05+99".into())));
        assert_eq!(field(body, "subject"), Ok(Some("a b c".into())));
        assert_eq!(field(body, "empty"), Ok(Some(String::new())));
        assert_eq!(field(body, "flag"), Ok(Some(String::new())));
        assert_eq!(field(body, "missing"), Ok(None));
        assert_eq!(field(b"a%3Db=1", "a=b"), Ok(Some("1".into())), "names are decoded too");
        assert_eq!(field(b"id=1&id=1", "id"), Err(FormError::Ambiguous));
        assert_eq!(field(b"id=%FF", "id"), Err(FormError::NotUtf8));
        assert_eq!(field(b"id=100%", "id"), Ok(Some("100%".into())));
    }
}

//! A field of a gRPC request message, read without its schema (`proto:<field>[.<field>…]`): the
//! `request_id` of Google's AIP-155 (`proto:2` when it is field 2), which Google's generated
//! clients fill with a UUID4 and keep across their retries.
//!
//! The body is one length-prefixed gRPC message (a unary call): a compressed flag byte, a 4-byte
//! big-endian length, the message. The path names field numbers from the top-level message down
//! through nested messages. Without the schema, what the wire says is all there is:
//! - a varint or fixed32/fixed64 field is an integer, read as its unsigned decimal value (the
//!   same for every sender of the same value, which is all a key needs);
//! - a length-delimited field is text when it is UTF-8 (a `string`), or the nested message the
//!   path goes into;
//! - a field sent more than once (a `repeated` field, or a message merged from two) is refused:
//!   which one is the key is ambiguous;
//! - groups (wire types 3 and 4, deprecated since proto2) are refused;
//! - a packed repeated field looks like bytes on the wire: it is read as text only if it happens
//!   to be UTF-8, so a key names a scalar field, as AIP-155's `request_id` is.

/// Why a message's field cannot be a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProtoError {
    /// The message is compressed (`grpc-encoding`): a key read from it needs an uncompressed call.
    Compressed,
    /// Not exactly one whole message (a stream, or a cut or padded frame).
    NotOneMessage(String),
    /// The bytes are not a protobuf message where the path goes.
    Malformed(String),
    /// The field is sent more than once.
    Repeated(u32, usize),
    /// A group (wire type 3 or 4).
    Group(u32),
    /// The field's bytes are neither UTF-8 text nor a place the path goes on into.
    NotText(u32),
}

impl std::fmt::Display for ProtoError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProtoError::Compressed => write!(
                f,
                "the gRPC message is compressed; a key read from the message needs the call uncompressed \
                 (no grpc-encoding), or a key in the metadata"
            ),
            ProtoError::NotOneMessage(why) => write!(f, "a key read from the message needs one whole message: {why}"),
            ProtoError::Malformed(why) => write!(f, "the message is not valid protobuf: {why}"),
            ProtoError::Repeated(field, n) => {
                write!(f, "field {field} is sent {n} times (a repeated field); which one is the key is ambiguous")
            }
            ProtoError::Group(field) => write!(f, "field {field} is a group (wire type 3/4), which a key cannot be"),
            ProtoError::NotText(field) => write!(f, "field {field} is bytes that are not UTF-8 text"),
        }
    }
}

/// The one message of a unary call's body.
fn the_message(body: &[u8]) -> Result<&[u8], ProtoError> {
    let Some((&flag, rest)) = body.split_first() else {
        return Err(ProtoError::NotOneMessage("the body is empty".into()));
    };
    if flag == 1 {
        return Err(ProtoError::Compressed);
    }
    if flag != 0 {
        return Err(ProtoError::NotOneMessage(format!("the frame's compressed flag is {flag}, not 0 or 1")));
    }
    let (len, message) = rest
        .split_first_chunk::<4>()
        .ok_or_else(|| ProtoError::NotOneMessage("the frame is cut before its length".into()))?;
    let len = u32::from_be_bytes(*len) as usize;
    match message.len().cmp(&len) {
        std::cmp::Ordering::Equal => Ok(message),
        std::cmp::Ordering::Less => {
            Err(ProtoError::NotOneMessage(format!("the frame says {len} bytes and {} arrived", message.len())))
        }
        std::cmp::Ordering::Greater => Err(ProtoError::NotOneMessage("more than one message was sent".into())),
    }
}

fn varint(bytes: &[u8], at: &mut usize) -> Result<u64, ProtoError> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *bytes.get(*at).ok_or_else(|| ProtoError::Malformed("a varint is cut short".into()))?;
        *at += 1;
        value |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(ProtoError::Malformed("a varint is longer than 10 bytes".into()))
}

/// A field's value on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wire<'a> {
    Number(u64),
    Bytes(&'a [u8]),
}

/// Every occurrence of field `wanted` in `message`.
fn occurrences(message: &[u8], wanted: u32) -> Result<Vec<Wire<'_>>, ProtoError> {
    let mut found = Vec::new();
    let mut at = 0;
    while at < message.len() {
        let tag = varint(message, &mut at)?;
        let field = u32::try_from(tag >> 3).map_err(|_| ProtoError::Malformed("a field number is too large".into()))?;
        if field == 0 {
            return Err(ProtoError::Malformed("field number 0".into()));
        }
        let fixed = |n: usize, at: &mut usize| -> Result<u64, ProtoError> {
            let bytes = message
                .get(*at..*at + n)
                .ok_or_else(|| ProtoError::Malformed(format!("field {field} is cut short")))?;
            *at += n;
            Ok(bytes.iter().rev().fold(0u64, |v, b| (v << 8) | u64::from(*b)))
        };
        let value = match tag & 7 {
            0 => Wire::Number(varint(message, &mut at)?),
            1 => Wire::Number(fixed(8, &mut at)?),
            5 => Wire::Number(fixed(4, &mut at)?),
            2 => {
                let len = usize::try_from(varint(message, &mut at)?)
                    .map_err(|_| ProtoError::Malformed(format!("field {field}'s length is too large")))?;
                let bytes = at
                    .checked_add(len)
                    .and_then(|end| message.get(at..end))
                    .ok_or_else(|| ProtoError::Malformed(format!("field {field} is cut short")))?;
                at += len;
                Wire::Bytes(bytes)
            }
            3 | 4 => return Err(ProtoError::Group(field)),
            w => return Err(ProtoError::Malformed(format!("field {field} has wire type {w}"))),
        };
        if field == wanted {
            found.push(value);
        }
    }
    Ok(found)
}

/// The value of the field at `path` in a unary call's body: `Ok(None)` when the message does not
/// carry it (proto3 leaves out a field at its default: an empty `request_id` is a missing key).
pub fn field(body: &[u8], path: &[u32]) -> Result<Option<String>, ProtoError> {
    let mut message = the_message(body)?;
    for (depth, &wanted) in path.iter().enumerate() {
        let found = occurrences(message, wanted)?;
        let value = match found.as_slice() {
            [] => return Ok(None),
            [one] => *one,
            many => return Err(ProtoError::Repeated(wanted, many.len())),
        };
        let last = depth + 1 == path.len();
        match (value, last) {
            (Wire::Number(n), true) => return Ok(Some(n.to_string())),
            (Wire::Bytes(b), true) => {
                return String::from_utf8(b.to_vec()).map(Some).map_err(|_| ProtoError::NotText(wanted));
            }
            (Wire::Bytes(b), false) => message = b,
            (Wire::Number(_), false) => {
                return Err(ProtoError::Malformed(format!("field {wanted} is a number, not a message to go into")));
            }
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(message: &[u8]) -> Vec<u8> {
        let mut out = vec![0];
        out.extend_from_slice(&(message.len() as u32).to_be_bytes());
        out.extend_from_slice(message);
        out
    }

    fn len_field(field: u32, bytes: &[u8]) -> Vec<u8> {
        let mut out = vec![((field << 3) | 2) as u8, bytes.len() as u8];
        out.extend_from_slice(bytes);
        out
    }

    #[test]
    fn strings_integers_and_nested_fields() {
        // { 1: "req-7", 2: 150, 4: { 2: "inner" } }
        let mut m = len_field(1, b"req-7");
        m.extend_from_slice(&[0x10, 0x96, 0x01]);
        m.extend(len_field(4, &len_field(2, b"inner")));
        let body = frame(&m);
        assert_eq!(field(&body, &[1]), Ok(Some("req-7".into())));
        assert_eq!(field(&body, &[2]), Ok(Some("150".into())));
        assert_eq!(field(&body, &[4, 2]), Ok(Some("inner".into())));
        assert_eq!(field(&body, &[3]), Ok(None));
        assert_eq!(field(&body, &[4, 9]), Ok(None));
    }

    #[test]
    fn what_cannot_be_a_key_is_refused_with_its_reason() {
        let twice = [len_field(1, b"a"), len_field(1, b"b")].concat();
        assert_eq!(field(&frame(&twice), &[1]), Err(ProtoError::Repeated(1, 2)));
        assert_eq!(field(&frame(&[0x0b, 0x0c]), &[1]), Err(ProtoError::Group(1)));
        assert_eq!(field(&frame(&len_field(1, &[0xff, 0xfe])), &[1]), Err(ProtoError::NotText(1)));
        let mut compressed = frame(&len_field(1, b"a"));
        compressed[0] = 1;
        assert_eq!(field(&compressed, &[1]), Err(ProtoError::Compressed));
        let two = [frame(b""), frame(b"")].concat();
        assert!(matches!(field(&two, &[1]), Err(ProtoError::NotOneMessage(_))));
        assert!(matches!(field(&frame(&len_field(1, b"abc"))[..7], &[1]), Err(ProtoError::NotOneMessage(_))));
        assert!(matches!(field(&frame(&[0x0a, 0x09, b'a']), &[1]), Err(ProtoError::Malformed(_))));
        assert!(matches!(field(&frame(&[0x08, 0x01]), &[1, 2]), Err(ProtoError::Malformed(_))));
        assert!(matches!(field(&[], &[1]), Err(ProtoError::NotOneMessage(_))));
    }

    #[test]
    fn fixed_width_numbers_are_little_endian() {
        let m = [&[0x0d][..], &7u32.to_le_bytes(), &[0x11], &9u64.to_le_bytes()].concat();
        assert_eq!(field(&frame(&m), &[1]), Ok(Some("7".into())));
        assert_eq!(field(&frame(&m), &[2]), Ok(Some("9".into())));
    }
}

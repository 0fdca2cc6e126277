//! Reading the text of one element out of a plain XML body (WeChat Pay v2's notify:
//! `<xml><transaction_id><![CDATA[…]]></transaction_id>…</xml>`), with `quick-xml`.
//!
//! Only plain XML is read: elements, text, CDATA, comments, the XML declaration, the five
//! predefined entities and character references. A DTD, an entity of any other name or a
//! processing instruction is refused, never expanded (no billion laughs, no external entities),
//! and so is nesting deeper than [`MAX_DEPTH`]. An element that appears twice at the path is
//! ambiguous, as a JSON member named twice is.

use quick_xml::events::Event;
use quick_xml::Reader;

/// Deeper than any payment notification; deeper nesting is refused.
pub const MAX_DEPTH: usize = 32;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum XmlError {
    /// Not well-formed XML (or not UTF-8).
    NotXml(String),
    /// A DTD, a general entity, a processing instruction, nesting too deep: refused.
    Refused(String),
    /// The element appears more than once at the path.
    Ambiguous,
    /// The element holds other elements, not text.
    NotText,
}

/// The text of the element at `path` (element names from the root), `Ok(None)` when there is none.
pub fn element_text(body: &[u8], path: &[String]) -> Result<Option<String>, XmlError> {
    let text = std::str::from_utf8(body).map_err(|_| XmlError::NotXml("the body is not UTF-8".into()))?;
    let mut reader = Reader::from_str(text);
    reader.config_mut().check_end_names = true;
    let mut stack: Vec<String> = Vec::new();
    let mut found: Option<String> = None;
    // The text of the element at the path while inside it.
    let mut current: Option<String> = None;
    let mut seen_root = false;
    loop {
        let event = reader.read_event().map_err(|e| XmlError::NotXml(e.to_string()))?;
        match event {
            Event::Eof => break,
            Event::Decl(_) | Event::Comment(_) => {}
            Event::DocType(_) => return Err(XmlError::Refused("a DTD (<!DOCTYPE …>)".into())),
            Event::PI(_) => return Err(XmlError::Refused("a processing instruction (<?…?>)".into())),
            Event::Start(e) => {
                seen_root = true;
                if current.is_some() {
                    return Err(XmlError::NotText);
                }
                stack.push(e.name().as_ref().to_string());
                if stack.len() > MAX_DEPTH {
                    return Err(XmlError::Refused(format!("elements nested deeper than {MAX_DEPTH}")));
                }
                if stack == path {
                    if found.is_some() {
                        return Err(XmlError::Ambiguous);
                    }
                    current = Some(String::new());
                }
            }
            Event::Empty(e) => {
                seen_root = true;
                if current.is_some() {
                    return Err(XmlError::NotText);
                }
                stack.push(e.name().as_ref().to_string());
                if stack == path {
                    if found.is_some() {
                        return Err(XmlError::Ambiguous);
                    }
                    found = Some(String::new());
                }
                stack.pop();
            }
            Event::End(_) => {
                if stack == path {
                    found = current.take();
                }
                stack.pop();
            }
            Event::Text(t) => {
                if stack.is_empty() && !t.xml10_content().trim().is_empty() {
                    return Err(XmlError::NotXml("text outside the root element".into()));
                }
                if let Some(c) = current.as_mut() {
                    c.push_str(&t.xml10_content());
                }
            }
            Event::CData(t) => {
                if let Some(c) = current.as_mut() {
                    c.push_str(&t.xml10_content());
                }
            }
            Event::GeneralRef(r) => {
                let ch = resolve(&r)?;
                if let Some(c) = current.as_mut() {
                    c.push(ch);
                }
            }
        }
    }
    if !stack.is_empty() {
        return Err(XmlError::NotXml("unclosed elements at the end of the body".into()));
    }
    if !seen_root {
        return Err(XmlError::NotXml("no root element".into()));
    }
    Ok(found)
}

/// A predefined entity or a character reference; every other entity is refused.
fn resolve(r: &quick_xml::events::BytesRef<'_>) -> Result<char, XmlError> {
    if r.is_char_ref() {
        return match r.resolve_char_ref() {
            Ok(Some(c)) => Ok(c),
            _ => Err(XmlError::NotXml(format!("invalid character reference &{};", r.xml10_content()))),
        };
    }
    match r.xml10_content().as_ref() {
        "lt" => Ok('<'),
        "gt" => Ok('>'),
        "amp" => Ok('&'),
        "apos" => Ok('\''),
        "quot" => Ok('"'),
        other => Err(XmlError::Refused(format!("the entity &{other};"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(p: &str) -> Vec<String> {
        crate::policy::xml_path(p).unwrap_or_default()
    }

    #[test]
    fn wechat_v2_notify_fields() {
        let body = br#"<?xml version="1.0" encoding="UTF-8"?>
<xml><return_code><![CDATA[SUCCESS]]></return_code>
<transaction_id><![CDATA[4200001234202401011234567890]]></transaction_id>
<out_trade_no>A&amp;B&#x31;</out_trade_no><!-- a comment --><empty/></xml>"#;
        assert_eq!(element_text(body, &path("/xml/transaction_id")), Ok(Some("4200001234202401011234567890".into())));
        assert_eq!(element_text(body, &path("/xml/out_trade_no")), Ok(Some("A&B1".into())));
        assert_eq!(element_text(body, &path("/xml/empty")), Ok(Some(String::new())));
        assert_eq!(element_text(body, &path("/xml/missing")), Ok(None));
        assert_eq!(element_text(body, &path("/other/transaction_id")), Ok(None));
        assert_eq!(element_text(body, &path("/xml")), Err(XmlError::NotText));
    }

    #[test]
    fn hostile_xml_is_refused_never_expanded() {
        let bomb = br#"<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;">]><xml><id>&lol2;</id></xml>"#;
        assert!(matches!(element_text(bomb, &path("/xml/id")), Err(XmlError::Refused(m)) if m.contains("DTD")));
        let external = br#"<xml><id>&xxe;</id></xml>"#;
        assert!(matches!(element_text(external, &path("/xml/id")), Err(XmlError::Refused(m)) if m.contains("&xxe;")));
        let pi = br#"<?xml-stylesheet href="x"?><xml><id>1</id></xml>"#;
        assert!(matches!(element_text(pi, &path("/xml/id")), Err(XmlError::Refused(_))));
        let deep = format!("{}{}", "<a>".repeat(40), "</a>".repeat(40));
        assert!(matches!(element_text(deep.as_bytes(), &path("/b")), Err(XmlError::Refused(_))));
        let twice = b"<xml><id>1</id><id>2</id></xml>";
        assert_eq!(element_text(twice, &path("/xml/id")), Err(XmlError::Ambiguous));
        assert!(matches!(element_text(b"<xml><id>1</xml>", &path("/xml/id")), Err(XmlError::NotXml(_))));
        assert!(matches!(element_text(b"\xff<xml/>", &path("/xml")), Err(XmlError::NotXml(_))));
        assert!(matches!(element_text(b"<xml><id>1</id>", &path("/xml/id")), Err(XmlError::NotXml(_))));
    }
}

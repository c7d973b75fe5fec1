//! The format of systemd's `EnvironmentFile=` (systemd.exec(5)), which a
//! `sluice.env` settings file shares with the systemd units that read the
//! same file: one `VAR=value` a line; blank lines and lines starting with
//! `#` or `;` ignored; whitespace around the name and the value dropped;
//! a value (or its parts) in single quotes taken literally, in double
//! quotes with `\"`, `\\`, `` \` `` and `\$` unescaped; outside quotes a
//! backslash takes the next character literally; a backslash at the end
//! of a line continues the value on the next. A variable given twice
//! keeps its last value, as in systemd.
//!
//! What systemd skips without a word is an error here, so that a damaged
//! file is not half read: a line with no `=`, a name that is not a
//! variable name, a quote never closed.

use anyhow::bail;

/// Whether `name` is a variable name: letters, digits and `_`, not
/// starting with a digit.
fn is_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Where a value's reading stands.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Value {
    /// Before its first character, or right after a quoted part: blanks
    /// are skipped, a quote opens a quoted part.
    Between,
    /// In unquoted text: a quote is an ordinary character, blanks are kept
    /// (but the trailing ones).
    Plain,
}

/// The assignments of `text`, in order.
pub fn parse(text: &str) -> anyhow::Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    let mut chars = text.chars().peekable();
    let mut line = 1usize;
    loop {
        // The start of a line: blanks and empty lines skipped.
        while let Some(&c) = chars.peek() {
            match c {
                '\n' => line += 1,
                ' ' | '\t' | '\r' => {}
                _ => break,
            }
            chars.next();
        }
        let Some(&first) = chars.peek() else {
            return Ok(out);
        };
        if first == '#' || first == ';' {
            for c in chars.by_ref() {
                if c == '\n' {
                    line += 1;
                    break;
                }
            }
            continue;
        }
        let at = line;
        let mut name = String::new();
        loop {
            match chars.next() {
                Some('=') => break,
                None | Some('\n') => {
                    bail!("line {at}: {:?} is not VAR=value", name.trim_end())
                }
                Some(c) => name.push(c),
            }
        }
        let name = name.trim_end().to_owned();
        if !is_name(&name) {
            bail!(
                "line {at}: {name:?} is not a variable name (letters, digits and _, \
                 not starting with a digit)"
            );
        }
        let mut value = String::new();
        let mut state = Value::Between;
        // Where the current run of blanks of plain text began.
        let mut blanks: Option<usize> = None;
        while let Some(c) = chars.next() {
            match c {
                '\n' => {
                    line += 1;
                    break;
                }
                '\'' if state == Value::Between => loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(c) => {
                            line += usize::from(c == '\n');
                            value.push(c);
                        }
                        None => bail!("line {at}: the ' quote of {name} is never closed"),
                    }
                },
                '"' if state == Value::Between => loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(e @ ('"' | '\\' | '`' | '$')) => value.push(e),
                            Some('\n') => line += 1,
                            Some(e) => {
                                value.push('\\');
                                value.push(e);
                            }
                            None => bail!("line {at}: the \" quote of {name} is never closed"),
                        },
                        Some(c) => {
                            line += usize::from(c == '\n');
                            value.push(c);
                        }
                        None => bail!("line {at}: the \" quote of {name} is never closed"),
                    }
                },
                '\\' => {
                    state = Value::Plain;
                    blanks = None;
                    match chars.next() {
                        Some('\n') => line += 1,
                        Some(e) => value.push(e),
                        None => {}
                    }
                }
                ' ' | '\t' | '\r' => {
                    if state == Value::Plain {
                        blanks.get_or_insert(value.len());
                        value.push(c);
                    }
                }
                c => {
                    state = Value::Plain;
                    blanks = None;
                    value.push(c);
                }
            }
        }
        if let Some(end) = blanks {
            value.truncate(end);
        }
        out.retain(|(n, _): &(String, String)| *n != name);
        out.push((name, value));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(text: &str) -> (String, String) {
        let mut all = parse(text).unwrap();
        assert_eq!(all.len(), 1, "{text:?} → {all:?}");
        all.remove(0)
    }

    fn value(text: &str) -> String {
        one(text).1
    }

    #[test]
    fn systemds_quoting_and_escapes() {
        assert_eq!(one("RUST_LOG="), ("RUST_LOG".into(), String::new()));
        assert_eq!(value("META_PASSWORD=\"p a#ss\""), "p a#ss");
        assert_eq!(value("A='x\\y \"z\"'"), "x\\y \"z\"");
        assert_eq!(value(r#"A="x\"y\\z\q\$""#), "x\"y\\z\\q$");
        assert_eq!(value("A=one two  \t"), "one two");
        assert_eq!(value("A=a\\\nb"), "ab");
        assert_eq!(value("A=\"multi\\\nline\""), "multiline");
        assert_eq!(value("  B = v  "), "v");
        assert_eq!(value("A=\"x\" 'y'"), "xy");
        assert_eq!(value("A=x \"y\""), "x \"y\"");
        assert_eq!(value("A=x\\ "), "x ");
        assert_eq!(value("A=x # not a comment"), "x # not a comment");
    }

    #[test]
    fn comments_blank_lines_and_repeats() {
        let all = parse("# c\n; c\n\n  \nA=1\r\nB=2\nA=3").unwrap();
        assert_eq!(
            all,
            [("B".into(), "2".into()), ("A".into(), "3".into())] as [(String, String); 2]
        );
    }

    #[test]
    fn a_damaged_file_is_refused_by_line() {
        let err = |t: &str| parse(t).unwrap_err().to_string();
        assert_eq!(err("A=1\nNOEQ\n"), "line 2: \"NOEQ\" is not VAR=value");
        assert!(err("1A=x").contains("line 1: \"1A\" is not a variable name"));
        assert!(err("A B=x").contains("not a variable name"));
        assert_eq!(
            err("A=1\nB=\"open\nC=2"),
            "line 2: the \" quote of B is never closed"
        );
        assert_eq!(err("X='open"), "line 1: the ' quote of X is never closed");
    }
}

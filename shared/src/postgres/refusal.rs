//! What Postgres said when it refused a statement: its SQLSTATE and its
//! primary message. A statement Postgres answered with an error certainly
//! did not commit; one that got no answer (a broken connection, a timeout)
//! may have.

use std::fmt;

/// Postgres's error answer to one statement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The SQLSTATE, e.g. `22P05`.
    pub code: String,
    /// The primary message, with anything quoted in it left out (Postgres
    /// quotes input values there, and those may be payload text); never
    /// the detail or the context, which quote input too.
    pub message: String,
}

impl Refusal {
    /// The refusal inside `e`, if Postgres answered at all.
    pub fn of(e: &tokio_postgres::Error) -> Option<Self> {
        let db = e.as_db_error()?;
        Some(Self {
            code: db.code().code().to_owned(),
            message: unquoted(db.message()),
        })
    }

    /// A data exception (class 22) or an integrity constraint violation
    /// (class 23): the same statement on the same row fails again, so the
    /// row is refused for good.
    pub fn is_row_level(&self) -> bool {
        self.code.starts_with("22") || self.code.starts_with("23")
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Postgres refused the statement ({}): {}",
            self.code, self.message
        )
    }
}

/// `message` without its quoted parts, and short.
fn unquoted(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut quoted = false;
    for c in message.chars() {
        match c {
            '"' if quoted => {
                quoted = false;
                out.push_str("…\"");
            }
            '"' => {
                quoted = true;
                out.push('"');
            }
            _ if quoted => {}
            c if c.is_control() => out.push(' '),
            c => out.push(c),
        }
    }
    if quoted {
        out.push_str("…\"");
    }
    out.chars().take(200).collect()
}

/// How a failed statement reads in logs and stored errors: Postgres's
/// message and SQLSTATE when it answered, otherwise what broke.
pub fn describe(e: &tokio_postgres::Error) -> String {
    match Refusal::of(e) {
        Some(r) => format!("{} ({})", r.message, r.code),
        None => {
            // tokio-postgres's own text ("db error", "connection closed",
            // an I/O error); the source carries the rest.
            let mut text = e.to_string();
            let mut source = std::error::Error::source(e);
            while let Some(s) = source {
                text.push_str(": ");
                text.push_str(&s.to_string());
                source = s.source();
            }
            text
        }
    }
}

#[cfg(test)]
mod tests {
    use super::unquoted;

    #[test]
    fn quoted_input_is_left_out() {
        assert_eq!(
            unquoted("invalid input syntax for type integer: \"secret payload\""),
            "invalid input syntax for type integer: \"…\""
        );
        assert_eq!(
            unquoted("unsupported Unicode escape sequence"),
            "unsupported Unicode escape sequence"
        );
        assert_eq!(unquoted("a \"b"), "a \"…\"");
    }
}

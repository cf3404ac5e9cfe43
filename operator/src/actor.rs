//! Who acts: a console token's name and role, or the operator who runs a
//! command (`--as NAME`, by default the OS user). The audit log and a
//! job's lineage name them.

/// What a token may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Reads everything but payload bodies; changes nothing.
    Viewer,
    /// Reads everything, payloads included, and replays and purges.
    Operator,
}

impl Role {
    /// The name in the tokens file and the audit log.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Viewer => "viewer",
            Self::Operator => "operator",
        }
    }
}

/// Who is calling.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// The token's name.
    pub name: String,
    /// Its role.
    pub role: Role,
}

impl Identity {
    /// An operator acting from the command line.
    pub fn operator(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            role: Role::Operator,
        }
    }
}

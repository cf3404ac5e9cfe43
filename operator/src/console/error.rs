//! What the console answers when something is wrong: one error type,
//! mapped to a status, with a message that names the field at fault and
//! never carries a secret or a payload. The API answers JSON
//! (`{"error": …, "field": …}`); pages answer HTML, and send a caller who
//! is not signed in to the sign-in page.

use actix_web::http::StatusCode;
use actix_web::http::header;
use actix_web::{HttpResponse, ResponseError};
use hookinbox::postgres::DbError;
use serde_json::json;

/// Why a request was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// No valid token or session.
    #[error("a valid token is required (Authorization: Bearer, or sign in)")]
    Unauthorized,
    /// A bad token from a client that is throttled (a valid token still
    /// passes).
    #[error("too many failed sign-ins from this client; retry in {0} s")]
    Throttled(u64),
    /// The caller may not do this (a viewer's change, a form without its
    /// CSRF token).
    #[error("{0}")]
    Forbidden(&'static str),
    /// A bad parameter or field, named.
    #[error("{field}: {problem}")]
    BadField {
        /// The parameter or field.
        field: String,
        /// What is wrong with it.
        problem: String,
    },
    /// No such delivery or job.
    #[error("{0}")]
    NotFound(String),
    /// The request conflicts with the current state (a finished job).
    #[error("{0}")]
    Conflict(String),
    /// A body larger than the call takes.
    #[error("the body is larger than {0} bytes")]
    TooLarge(usize),
    /// A body that did not arrive in time.
    #[error("the body did not arrive in time")]
    SlowBody,
    /// Postgres failed. The answer says only that; the cause is logged
    /// (it can carry a statement's text or a value from the request).
    #[error("database unavailable; the console's log has the cause")]
    Db(#[from] DbError),
}

impl AdminError {
    /// A bad field.
    pub fn field(field: impl Into<String>, problem: impl Into<String>) -> Self {
        Self::BadField {
            field: field.into(),
            problem: problem.into(),
        }
    }

    fn field_name(&self) -> Option<&str> {
        match self {
            Self::BadField { field, .. } => Some(field),
            Self::TooLarge(_) | Self::SlowBody => Some("body"),
            _ => None,
        }
    }

    /// Whether the request's body was left unread, so that its connection
    /// cannot carry another request and is closed after the answer.
    fn leaves_body_unread(&self) -> bool {
        matches!(self, Self::TooLarge(_) | Self::SlowBody)
    }
}

impl From<deadpool_postgres::PoolError> for AdminError {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        Self::Db(DbError::from(e))
    }
}

impl From<tokio_postgres::Error> for AdminError {
    fn from(e: tokio_postgres::Error) -> Self {
        Self::Db(DbError::from(e))
    }
}

/// The status of each error.
fn status_of(e: &AdminError) -> StatusCode {
    match e {
        AdminError::Unauthorized => StatusCode::UNAUTHORIZED,
        AdminError::Throttled(_) => StatusCode::TOO_MANY_REQUESTS,
        AdminError::Forbidden(_) => StatusCode::FORBIDDEN,
        AdminError::BadField { .. } => StatusCode::BAD_REQUEST,
        AdminError::NotFound(_) => StatusCode::NOT_FOUND,
        AdminError::Conflict(_) => StatusCode::CONFLICT,
        AdminError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
        AdminError::SlowBody => StatusCode::REQUEST_TIMEOUT,
        AdminError::Db(_) => StatusCode::SERVICE_UNAVAILABLE,
    }
}

/// An error answered as JSON (the API).
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct ApiError(pub AdminError);

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        status_of(&self.0)
    }

    fn error_response(&self) -> HttpResponse {
        if let AdminError::Db(e) = &self.0 {
            tracing::warn!(error = %e, "admin request failed");
        }
        let mut body = json!({"error": self.0.to_string()});
        if let Some(field) = self.0.field_name() {
            body["field"] = json!(field);
        }
        let mut answer = HttpResponse::build(self.status_code());
        if self.0.leaves_body_unread() {
            answer.force_close();
        }
        if let AdminError::Throttled(secs) = self.0 {
            answer.insert_header((header::RETRY_AFTER, secs.to_string()));
        }
        if matches!(self.0, AdminError::Unauthorized) {
            answer.insert_header((header::WWW_AUTHENTICATE, "Bearer"));
        }
        answer.json(body)
    }
}

/// An error answered as a page.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct PageError(pub AdminError);

/// `?` on anything that makes an [`AdminError`], in API and page handlers.
macro_rules! wrap_errors {
    ($($wrapper:ident),*) => {$(
        impl From<AdminError> for $wrapper {
            fn from(e: AdminError) -> Self {
                Self(e)
            }
        }
        impl From<DbError> for $wrapper {
            fn from(e: DbError) -> Self {
                Self(e.into())
            }
        }
        impl From<deadpool_postgres::PoolError> for $wrapper {
            fn from(e: deadpool_postgres::PoolError) -> Self {
                Self(e.into())
            }
        }
        impl From<tokio_postgres::Error> for $wrapper {
            fn from(e: tokio_postgres::Error) -> Self {
                Self(e.into())
            }
        }
    )*};
}

wrap_errors!(ApiError, PageError);

impl ResponseError for PageError {
    fn status_code(&self) -> StatusCode {
        match self.0 {
            AdminError::Unauthorized => StatusCode::SEE_OTHER,
            _ => status_of(&self.0),
        }
    }

    fn error_response(&self) -> HttpResponse {
        if let AdminError::Db(e) = &self.0 {
            tracing::warn!(error = %e, "admin page failed");
        }
        if matches!(self.0, AdminError::Unauthorized) {
            return HttpResponse::SeeOther()
                .insert_header((header::LOCATION, "/login"))
                .finish();
        }
        let mut answer = HttpResponse::build(self.status_code());
        if self.0.leaves_body_unread() {
            answer.force_close();
        }
        answer
            .content_type("text/html; charset=utf-8")
            .body(super::views::error_page(self.status_code(), &self.0.to_string()).into_string())
    }
}

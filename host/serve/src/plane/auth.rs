//! Who may do what (the tokens themselves are checked on the board: `crate::board::Credentials`).

use super::*;

impl Plane {
    pub(super) fn require_admin(caller: &Caller) -> Result<(), ApiError> {
        match caller {
            Caller::Admin => Ok(()),
            Caller::Tenant(t) => Err(ApiError::PermissionDenied(format!(
                "tenant `{t}` may not do this; it needs the admin token"
            ))),
            Caller::Node(_) => Err(node_token_refused()),
        }
    }
}

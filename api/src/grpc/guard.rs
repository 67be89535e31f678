//! The role check of every gRPC service, as a tonic interceptor:
//! it runs before the request is decoded, so a refused call changes nothing.

use std::sync::Arc;

use tonic::{Request, Status};

use crate::auth::{Authenticator, Denied, Peer, Role};

/// Refuses calls without `role`; with no `[server.auth]`, lets all through.
#[derive(Clone)]
pub struct Guard {
    auth: Option<Arc<Authenticator>>,
    role: Role,
}

impl Guard {
    pub fn new(auth: Option<Arc<Authenticator>>, role: Role) -> Self {
        Self { auth, role }
    }
}

impl tonic::service::Interceptor for Guard {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        let Some(auth) = &self.auth else { return Ok(request) };
        let authorization = request.metadata().get("authorization").and_then(|v| v.to_str().ok());
        match auth.check(self.role, authorization, request.extensions().get::<Peer>()) {
            Ok(()) => Ok(request),
            Err(denied @ Denied::Unauthenticated) => Err(Status::unauthenticated(denied.to_string())),
            Err(denied @ Denied::PermissionDenied) => {
                Err(Status::permission_denied(format!("{denied}: the {} role is needed", self.role.as_str())))
            }
        }
    }
}

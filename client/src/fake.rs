//! A caller that answers without a daemon, for tests.

use crate::client::{Answer, Caller, ClientError};
use allox_protocol::{Deleted, Request, Response};

/// A caller that answers every request the same way and counts calls.
pub struct Fake {
    pub calls: usize,
    pub answer: fn(&Request) -> Result<Answer, ClientError>,
}

impl Caller for Fake {
    fn call(&mut self, request: Request) -> Result<Answer, ClientError> {
        self.calls += 1;
        (self.answer)(&request)
    }
}

/// An answer for [`Fake::answer`]: the request's target deleted.
pub fn deleted(r: &Request) -> Result<Answer, ClientError> {
    Ok(Ok(Response::Deleted(Deleted {
        deleted: r.target(),
    })))
}

//! The DRA service, both versions (`v1.DRAPlugin` and `v1beta1.DRAPlugin`) over one handler.
//!
//! Each call is validated (every claim names namespace, UID and name; no UID twice), answered
//! empty when it is empty, and otherwise handed to the [`ClaimHandler`] as one batch. The
//! handler's answer is completed to exactly the requested UIDs (see `wire::answers`), because the
//! kubelet fails a call whose response has one UID too many or too few.

use std::sync::Arc;

use dra_proto::{v1, v1beta1};
use tonic::{Request, Response, Status};
use tracing::debug;

use crate::{
    handler::{ClaimError, ClaimHandler, ClaimRef, PreparedDevice},
    wire,
};

/// Serves both DRA versions; cheap to clone (one shared handler).
#[derive(Debug)]
pub(crate) struct DraService<H> {
    handler: Arc<H>,
}

impl<H> DraService<H> {
    pub(crate) fn new(handler: Arc<H>) -> Self {
        Self { handler }
    }
}

impl<H> Clone for DraService<H> {
    fn clone(&self) -> Self {
        Self {
            handler: Arc::clone(&self.handler),
        }
    }
}

type Answers<T> = Vec<(String, Result<T, ClaimError>)>;

impl<H: ClaimHandler> DraService<H> {
    async fn prepare(
        &self,
        version: &str,
        claims: Vec<ClaimRef>,
    ) -> Result<Answers<Vec<PreparedDevice>>, Status> {
        wire::validate_claims(&claims)?;
        debug!(version, claims = claims.len(), "NodePrepareResources");
        if claims.is_empty() {
            // Nothing to prepare. Liveness probes (dra-example-driver's among them) send exactly
            // this, and it must succeed whenever we are alive, even before claims are served.
            return Ok(Vec::new());
        }
        let results = self.handler.prepare(&claims).await?;
        Ok(wire::answers("prepare", &claims, results))
    }

    async fn unprepare(&self, version: &str, claims: Vec<ClaimRef>) -> Result<Answers<()>, Status> {
        wire::validate_claims(&claims)?;
        debug!(version, claims = claims.len(), "NodeUnprepareResources");
        if claims.is_empty() {
            return Ok(Vec::new());
        }
        let results = self.handler.unprepare(&claims).await?;
        Ok(wire::answers("unprepare", &claims, results))
    }
}

#[tonic::async_trait]
impl<H: ClaimHandler> v1::dra_plugin_server::DraPlugin for DraService<H> {
    async fn node_prepare_resources(
        &self,
        request: Request<v1::NodePrepareResourcesRequest>,
    ) -> Result<Response<v1::NodePrepareResourcesResponse>, Status> {
        let claims = request.into_inner().claims.into_iter().map(ClaimRef::from);
        let answers = self.prepare("v1", claims.collect()).await?;
        Ok(Response::new(wire::prepare_v1(answers)))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<v1::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<v1::NodeUnprepareResourcesResponse>, Status> {
        let claims = request.into_inner().claims.into_iter().map(ClaimRef::from);
        let answers = self.unprepare("v1", claims.collect()).await?;
        Ok(Response::new(wire::unprepare_v1(answers)))
    }
}

#[tonic::async_trait]
impl<H: ClaimHandler> v1beta1::dra_plugin_server::DraPlugin for DraService<H> {
    async fn node_prepare_resources(
        &self,
        request: Request<v1beta1::NodePrepareResourcesRequest>,
    ) -> Result<Response<v1beta1::NodePrepareResourcesResponse>, Status> {
        let claims = request.into_inner().claims.into_iter().map(ClaimRef::from);
        let answers = self.prepare("v1beta1", claims.collect()).await?;
        Ok(Response::new(wire::prepare_v1beta1(answers)))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<v1beta1::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<v1beta1::NodeUnprepareResourcesResponse>, Status> {
        let claims = request.into_inner().claims.into_iter().map(ClaimRef::from);
        let answers = self.unprepare("v1beta1", claims.collect()).await?;
        Ok(Response::new(wire::unprepare_v1beta1(answers)))
    }
}

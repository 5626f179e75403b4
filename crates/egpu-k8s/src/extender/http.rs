//! The extender's HTTP routes.

use super::{BindingArgs, Extender, ExtenderArgs, PreemptionArgs};

/// `GET /metrics` (and `GET /healthz`) alone, for a separate address that
/// a Prometheus outside the pod can reach (`--metrics-listen`).
pub fn metrics_router(ext: std::sync::Arc<Extender>) -> axum::Router {
    crate::metrics::router(move || ext.metrics_text())
}

/// The extender's HTTP routes: `POST /filter`, `POST /prioritize`,
/// `POST /bind`, `POST /preempt`, `GET /metrics`, `GET /healthz`. A body that is not JSON of the protocol's shape gets
/// HTTP 400 with the reason; a request the extender cannot answer gets its
/// reason in the result's `Error` (filter, bind) or HTTP 400 (prioritize
/// and preempt, whose results have no error field).
pub fn router(ext: std::sync::Arc<Extender>) -> axum::Router {
    use axum::extract::{DefaultBodyLimit, State};
    use axum::http::StatusCode;
    use axum::response::{IntoResponse, Response};
    use axum::routing::post;
    type Ext = State<std::sync::Arc<Extender>>;

    fn parse(body: &[u8]) -> Result<ExtenderArgs, String> {
        serde_json::from_slice(body).map_err(|e| format!("not an ExtenderArgs JSON body: {e}"))
    }
    async fn filter(State(ext): Ext, body: axum::body::Bytes) -> Response {
        let t = std::time::Instant::now();
        let (ok, r) = match parse(&body) {
            Ok(args) => {
                let r = ext.filter(args);
                (r.error.is_empty(), axum::Json(r).into_response())
            }
            Err(why) => (false, (StatusCode::BAD_REQUEST, why).into_response()),
        };
        ext.metrics.request("filter", ok, t.elapsed());
        r
    }
    async fn bind(State(ext): Ext, body: axum::body::Bytes) -> Response {
        let t = std::time::Instant::now();
        let (ok, r) = match serde_json::from_slice::<BindingArgs>(&body) {
            Ok(args) => {
                let r = ext.bind(args).await;
                (r.error.is_empty(), axum::Json(r).into_response())
            }
            Err(e) => (false, (StatusCode::BAD_REQUEST, format!("not an ExtenderBindingArgs JSON body: {e}")).into_response()),
        };
        ext.metrics.request("bind", ok, t.elapsed());
        r
    }
    async fn prioritize(State(ext): Ext, body: axum::body::Bytes) -> Response {
        let t = std::time::Instant::now();
        let (ok, r) = match parse(&body).and_then(|a| ext.prioritize(a).map_err(|e| e.to_string())) {
            Ok(list) => (true, axum::Json(list).into_response()),
            Err(why) => (false, (StatusCode::BAD_REQUEST, why).into_response()),
        };
        ext.metrics.request("prioritize", ok, t.elapsed());
        r
    }
    async fn preempt(State(ext): Ext, body: axum::body::Bytes) -> Response {
        let t = std::time::Instant::now();
        let parsed = serde_json::from_slice::<PreemptionArgs>(&body).map_err(|e| format!("not an ExtenderPreemptionArgs JSON body: {e}"));
        let (ok, r) = match parsed.and_then(|a| ext.preempt(a).map_err(|e| e.to_string())) {
            Ok(result) => (true, axum::Json(result).into_response()),
            Err(why) => (false, (StatusCode::BAD_REQUEST, why).into_response()),
        };
        ext.metrics.request("preempt", ok, t.elapsed());
        r
    }
    axum::Router::new()
        .route("/filter", post(filter))
        .route("/prioritize", post(prioritize))
        .route("/bind", post(bind))
        .route("/preempt", post(preempt))
        // Without the node cache the scheduler sends whole Node objects:
        // ~14 KB each, so a 10,000-GPU cluster's request is ~18 MB.
        .layer(DefaultBodyLimit::max(256 << 20))
        .with_state(ext.clone())
        .merge(metrics_router(ext))
}

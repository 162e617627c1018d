//! The HTTP endpoint on `metrics.listen`: `/metrics` (Prometheus text), `/healthz` (the process
//! is alive) and `/readyz` (serving, with MySQL and the broker reachable; 503 otherwise, with the
//! reason as JSON).

use super::health::health;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use tokio_util::sync::CancellationToken;

/// Binds `listen` (at start-up, so a taken address is an error the user sees at once).
pub async fn bind(listen: &str) -> anyhow::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(listen).await.map_err(|e| {
        anyhow::anyhow!(
            "cannot listen on metrics.listen = {listen:?}: {e} (set another address with --metrics-listen, or \"\" to disable the endpoint)"
        )
    })
}

/// Serves on `listener` until `cancel` fires.
pub async fn serve(
    listener: tokio::net::TcpListener,
    cancel: CancellationToken,
) -> anyhow::Result<()> {
    tracing::info!(address = %listener.local_addr()?, "serving /metrics, /healthz, /readyz");
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready));
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { cancel.cancelled().await })
        .await?;
    Ok(())
}

async fn metrics() -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        super::relay().render(),
    )
}

async fn ready() -> impl IntoResponse {
    let readiness = health().readiness();
    let status = if readiness.ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(readiness))
}

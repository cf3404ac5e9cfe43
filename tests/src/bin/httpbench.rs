//! Baseline B_http: an actix-web handler that reads the body, checks the
//! HMAC and answers 202, with no I/O. `loadgen --search --no-e2e` against it
//! gives the HTTP-and-signature ceiling of this machine.

use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
use hookinbox::signature::{Secret, Secrets};

async fn receive(req: HttpRequest, body: web::Bytes, secrets: web::Data<Secrets>) -> HttpResponse {
    let header = req
        .headers()
        .get("x-hub-signature-256")
        .map(|v| v.as_bytes())
        .unwrap_or_default();
    match secrets.verify(&body, header) {
        Ok(_) => HttpResponse::Accepted().json(serde_json::json!({"status": "accepted"})),
        Err(_) => HttpResponse::Unauthorized().finish(),
    }
}

#[actix_web::main]
async fn main() -> std::io::Result<()> {
    let listen = std::env::var("HOOKINBOX_LISTEN").unwrap_or_else(|_| "127.0.0.1:8088".to_owned());
    let secret = std::env::var("HOOKINBOX_GITHUB_SECRET").unwrap_or_else(|_| "bench".to_owned());
    let secrets = web::Data::new(Secrets::new(vec![Secret::new(secret)]));
    HttpServer::new(move || {
        App::new()
            .app_data(secrets.clone())
            .app_data(web::PayloadConfig::new(26 * 1024 * 1024))
            .default_service(web::post().to(receive))
    })
    .bind(listen)?
    .run()
    .await
}

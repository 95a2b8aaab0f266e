//! A plain HTTP/1.1 endpoint on 127.0.0.1 for the tests of OpenAI-compatible clients: each
//! request's head and JSON body go to `answer`, which says the status line and the JSON reply.

use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

pub type Answer = dyn Fn(&str, &serde_json::Value) -> (&'static str, String) + Send + Sync;

pub async fn serve(listener: TcpListener, answer: Arc<Answer>) {
    loop {
        let Ok((mut sock, _)) = listener.accept().await else { return };
        let answer = answer.clone();
        tokio::spawn(async move {
            let mut buf = Vec::new();
            let mut chunk = [0u8; 8192];
            let (head, body_start) = loop {
                let n = sock.read(&mut chunk).await.unwrap();
                if n == 0 {
                    return;
                }
                buf.extend_from_slice(&chunk[..n]);
                if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    break (String::from_utf8_lossy(&buf[..i]).to_string(), i + 4);
                }
            };
            let len: usize = head
                .lines()
                .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse().unwrap()))
                .unwrap_or(0);
            while buf.len() < body_start + len {
                let n = sock.read(&mut chunk).await.unwrap();
                buf.extend_from_slice(&chunk[..n]);
            }
            let body: serde_json::Value = serde_json::from_slice(&buf[body_start..body_start + len]).unwrap();
            let (status, reply) = answer(&head, &body);
            let resp = format!(
                "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{reply}",
                reply.len()
            );
            sock.write_all(resp.as_bytes()).await.unwrap();
        });
    }
}

/// A chat completion whose first choice says `content`.
pub fn completion(content: &str) -> String {
    serde_json::json!({"choices": [{"message": {"role": "assistant", "content": content}}]}).to_string()
}

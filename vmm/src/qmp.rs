//! QMP, QEMU's machine protocol: JSON objects, one per line, over the
//! VM's Unix socket. After QEMU's greeting the client enables commands
//! (`qmp_capabilities`); then each `{"execute": …}` is answered by one
//! `{"return": …}` or `{"error": …}`, with asynchronous `{"event": …}`
//! objects in between (skipped here: the manager asks for state instead).

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum QmpError {
    #[error("cannot connect to QEMU's QMP socket {path}: {source}")]
    Connect {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("QMP: {0}")]
    Io(#[from] std::io::Error),
    #[error("QMP: QEMU closed the connection")]
    Closed,
    #[error("QMP: not JSON from QEMU: {0}")]
    Json(#[from] serde_json::Error),
    /// QEMU refused the command: its class and description.
    #[error("QEMU refused {command}: {class}: {desc}")]
    Refused {
        command: String,
        class: String,
        desc: String,
    },
}

/// One QMP connection.
pub struct Qmp {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Qmp {
    /// Connects (trying again until `timeout` while QEMU makes its socket),
    /// reads the greeting and enables commands.
    pub fn connect(path: &Path, timeout: Duration) -> Result<Qmp, QmpError> {
        let deadline = Instant::now() + timeout;
        let stream = loop {
            match UnixStream::connect(path) {
                Ok(s) => break s,
                Err(e) if Instant::now() >= deadline => {
                    return Err(QmpError::Connect {
                        path: path.display().to_string(),
                        source: e,
                    })
                }
                Err(_) => std::thread::sleep(Duration::from_millis(5)),
            }
        };
        stream.set_read_timeout(Some(Duration::from_secs(60)))?;
        let writer = stream.try_clone()?;
        let mut qmp = Qmp {
            reader: BufReader::new(stream),
            writer,
        };
        let greeting = qmp.read()?;
        if greeting.get("QMP").is_none() {
            return Err(QmpError::Refused {
                command: "the greeting".into(),
                class: "Protocol".into(),
                desc: format!("expected QEMU's greeting, got {greeting}"),
            });
        }
        qmp.execute("qmp_capabilities", None)?;
        Ok(qmp)
    }

    fn read(&mut self) -> Result<Value, QmpError> {
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            return Err(QmpError::Closed);
        }
        Ok(serde_json::from_str(&line)?)
    }

    /// Runs `command` with `arguments` and returns what it returned.
    pub fn execute(&mut self, command: &str, arguments: Option<Value>) -> Result<Value, QmpError> {
        let mut msg = json!({ "execute": command });
        if let Some(a) = arguments {
            msg["arguments"] = a;
        }
        let mut line = serde_json::to_vec(&msg)?;
        line.push(b'\n');
        self.writer.write_all(&line)?;
        loop {
            let v = self.read()?;
            if let Some(r) = v.get("return") {
                return Ok(r.clone());
            }
            if let Some(e) = v.get("error") {
                let s = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or("").to_string();
                return Err(QmpError::Refused {
                    command: command.to_string(),
                    class: s("class"),
                    desc: s("desc"),
                });
            }
            // An event: not the answer.
        }
    }
}

//! Output bindings of a payload-mode result (§4.1.5-6, §4.2): which value each binding gets and
//! writing queue outputs.

use std::sync::Arc;

use serde_json::{Map, Value};

use super::payload::{queue_output_messages, InvocationResult};
use crate::storage::{MessageEncoding, QueueStore, MAX_MESSAGE_TEXT};

/// A queue the host writes to (output binding) or moves poison messages to: the shipped
/// listener's (`crate::run::listen`), which moves poison messages the same way.
pub use crate::run::listen::QueueTarget;

pub enum OutputTarget<S> {
    Http,
    Queue(Arc<QueueTarget<S>>),
}

pub struct ResolvedOutput<S> {
    pub name: String,
    pub binary: bool,
    pub target: OutputTarget<S>,
}

/// The value each output binding receives: `Outputs[name]`, with `ReturnValue` replacing
/// `Outputs["$return"]` when a `$return` binding exists, or spread by key when it is an object
/// and there is none.
pub fn effective_outputs<S>(
    outputs: &[ResolvedOutput<S>],
    result: &InvocationResult,
) -> Map<String, Value> {
    let mut map = result.outputs.clone();
    let has_return = outputs.iter().any(|o| o.name == "$return");
    match &result.return_value {
        Some(v) if has_return => {
            map.insert("$return".into(), v.clone());
        }
        Some(Value::Object(o)) => {
            for (k, v) in o {
                map.insert(k.clone(), v.clone());
            }
        }
        _ => {}
    }
    map
}

/// Writes every queue output binding's messages; the first failure fails the invocation.
pub async fn write_queue_outputs<S: QueueStore>(
    outputs: &[ResolvedOutput<S>],
    values: &Map<String, Value>,
    encoding: MessageEncoding,
) -> Result<usize, String> {
    let mut written = 0;
    for output in outputs {
        let OutputTarget::Queue(target) = &output.target else {
            continue;
        };
        let Some(value) = values.get(&output.name).filter(|v| !v.is_null()) else {
            continue;
        };
        let messages = queue_output_messages(value, output.binary)
            .map_err(|e| format!("output {}: {e}", output.name))?;
        for bytes in messages {
            let text = encoding.encode(&bytes);
            if text.len() > MAX_MESSAGE_TEXT {
                return Err(format!(
                    "output {}: message of {} bytes exceeds the 64 KiB queue limit",
                    output.name,
                    text.len()
                ));
            }
            target
                .put(&text)
                .await
                .map_err(|e| format!("output {}: {e}", output.name))?;
            written += 1;
        }
    }
    Ok(written)
}

//! The Functions Consumption plan around tablescan's real router: instances with one vCPU,
//! queue listeners with `batchSize`/`newBatchThreshold` and polling back-off, the 10-minute
//! execution limit with redelivery, and a target-based scale controller that adds at most one
//! instance per 30 s. Every queue message is delivered to the real handler (`server::app`) as
//! the host would (payload per docs/custom-handler-protocol.md §3.3).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::http::Request;
use axum::Router;
use serde_json::json;
use tokio::sync::Notify;
use tokio::time::{sleep, timeout, Instant};
use tower::ServiceExt;

use crate::app::state::AppState;
use crate::storage::{MessageEncoding, QueueStore, ReceivedMessage};

use super::blog::Blog;
use super::cloud::{charge_cpu, CloudQueues, CloudTables, Cpu, CPU};
use super::model::Model;

pub type SimState = Arc<AppState<CloudTables, CloudQueues>>;

/// The queue-triggered functions: tablescan's two, or the blog's single worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Function {
    PrefixScan = 0,
    TableCopy = 1,
    /// The blog's `WorkerQueueFunction` (one queue, dispatch by envelope name).
    Worker = 2,
}

impl Function {
    fn name(self) -> &'static str {
        match self {
            Function::PrefixScan => "PrefixScan",
            Function::TableCopy => "TableCopy",
            Function::Worker => "Worker",
        }
    }
}

/// One finished (or timed-out) execution.
#[derive(Debug, Clone, Copy)]
pub struct Execution {
    pub start: Duration,
    pub duration: Duration,
    pub function: Function,
    pub succeeded: bool,
}

/// One Consumption instance.
pub struct Instance {
    pub cpu: Arc<Cpu>,
    in_flight: [AtomicUsize; 3],
    slot_freed: [Notify; 3],
    /// Executions running on this instance, and since when it has been busy (for billing).
    active: Mutex<(usize, Option<Instant>, Duration)>,
}

impl Instance {
    fn new() -> Self {
        Instance {
            cpu: Arc::new(Cpu::new()),
            in_flight: [
                AtomicUsize::new(0),
                AtomicUsize::new(0),
                AtomicUsize::new(0),
            ],
            slot_freed: [Notify::new(), Notify::new(), Notify::new()],
            active: Mutex::new((0, None, Duration::ZERO)),
        }
    }

    fn enter(&self) {
        let mut a = self.active.lock().unwrap();
        if a.0 == 0 {
            a.1 = Some(Instant::now());
        }
        a.0 += 1;
    }

    fn leave(&self) {
        let mut a = self.active.lock().unwrap();
        a.0 -= 1;
        if a.0 == 0 {
            let since = a.1.take().expect("busy since entering");
            a.2 += since.elapsed();
        }
    }

    /// Time this instance had at least one execution running (what Consumption bills).
    pub fn busy_time(&self) -> Duration {
        let a = self.active.lock().unwrap();
        a.2 + a.1.map_or(Duration::ZERO, |s| s.elapsed())
    }
}

/// Which function app runs.
#[derive(Clone)]
pub enum ScanMode {
    /// tablescan: its real router behind two queues (PrefixScan, TableCopy).
    Router,
    /// The blog's app: one worker queue, dispatch by envelope name (see `blog.rs`).
    Blog(Arc<Blog>),
}

/// The simulated function app.
pub struct Host {
    pub model: Arc<Model>,
    pub state: SimState,
    pub router: Router,
    pub mode: ScanMode,
    pub epoch: Instant,
    pub instances: Mutex<Vec<Arc<Instance>>>,
    pub executions: Mutex<Vec<Execution>>,
    /// (seconds since start, instance count) at every change.
    pub instance_timeline: Mutex<Vec<(f64, usize)>>,
    pub stopped: AtomicBool,
    /// Executions dequeued and not yet finished (deleted, released or abandoned).
    pub running: AtomicUsize,
    /// Executions abandoned at the execution limit.
    pub timeouts: AtomicUsize,
}

impl Host {
    fn queue(&self, f: Function) -> &str {
        match (f, &self.mode) {
            (Function::PrefixScan, _) => &self.state.config.prefix_scan_queue,
            (Function::TableCopy, _) => &self.state.config.table_copy_queue,
            (Function::Worker, ScanMode::Blog(blog)) => &blog.queue,
            (Function::Worker, ScanMode::Router) => unreachable!("tablescan has no Worker"),
        }
    }

    /// The functions this app has.
    pub fn functions(&self) -> &'static [Function] {
        match self.mode {
            ScanMode::Router => &[Function::PrefixScan, Function::TableCopy],
            ScanMode::Blog(_) => &[Function::Worker],
        }
    }

    /// Allocates an instance; it takes messages after the cold start.
    pub fn add_instance(self: &Arc<Self>) {
        let instance = Arc::new(Instance::new());
        let count = {
            let mut all = self.instances.lock().unwrap();
            all.push(instance.clone());
            all.len()
        };
        self.instance_timeline
            .lock()
            .unwrap()
            .push((self.epoch.elapsed().as_secs_f64(), count));
        for &f in self.functions() {
            let host = self.clone();
            let instance = instance.clone();
            tokio::spawn(async move {
                sleep(Duration::from_secs_f64(host.model.cold_start_s)).await;
                host.listen(instance, f).await;
            });
        }
    }

    /// The queue listener of one function on one instance.
    async fn listen(self: Arc<Self>, instance: Arc<Instance>, f: Function) {
        let m = self.model.clone();
        let queue = self.queue(f).to_string();
        // Dequeued messages stay invisible past the execution limit, so only a timed-out
        // execution's message comes back (the host renews visibility while a function runs).
        let visibility = Duration::from_secs_f64(m.function_timeout_s + 30.0);
        let mut delay = m.min_polling_ms;
        let mut rng_state = (f as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        while !self.stopped.load(Ordering::Relaxed) {
            while instance.in_flight[f as usize].load(Ordering::Relaxed) > m.new_batch_threshold {
                instance.slot_freed[f as usize].notified().await;
            }
            let received = CPU
                .scope(
                    instance.cpu.clone(),
                    self.state
                        .queues
                        .get_messages(&queue, m.batch_size, visibility),
                )
                .await
                .unwrap_or_default();
            if received.is_empty() {
                // Randomized exponential back-off up to maxPollingInterval, as the host does.
                rng_state ^= rng_state << 13;
                rng_state ^= rng_state >> 7;
                rng_state ^= rng_state << 17;
                let spread = 0.8 + (rng_state % 400) as f64 / 1000.0;
                sleep(Model::ms(delay * spread)).await;
                delay = (delay * 2.0).min(m.max_polling_ms);
                continue;
            }
            delay = m.min_polling_ms;
            for message in received {
                self.running.fetch_add(1, Ordering::Relaxed);
                instance.in_flight[f as usize].fetch_add(1, Ordering::Relaxed);
                let host = self.clone();
                let instance = instance.clone();
                let queue = queue.clone();
                tokio::spawn(async move {
                    host.execute(&instance, f, &queue, message).await;
                    host.running.fetch_sub(1, Ordering::Relaxed);
                    instance.in_flight[f as usize].fetch_sub(1, Ordering::Relaxed);
                    instance.slot_freed[f as usize].notify_one();
                });
            }
        }
    }

    /// One execution: invoke, then delete, release or (after a timeout) abandon the message.
    async fn execute(&self, instance: &Instance, f: Function, queue: &str, m: ReceivedMessage) {
        let model = self.model.clone();
        let start = Instant::now();
        instance.enter();
        let limit = Duration::from_secs_f64(model.function_timeout_s);
        let outcome = CPU
            .scope(instance.cpu.clone(), async {
                sleep(Model::ms(model.invocation_overhead_ms)).await;
                charge_cpu(model.cpu_per_execution_ms).await;
                timeout(limit, self.invoke(f, &m)).await
            })
            .await;
        let duration = start.elapsed();
        instance.leave();
        let succeeded = matches!(outcome, Ok(true));
        let queues = &self.state.queues;
        CPU.scope(instance.cpu.clone(), async {
            match outcome {
                // Success, or the last failed attempt (the host moves it to the poison queue).
                Ok(ok) if ok || m.dequeue_count >= model.max_dequeue_count => {
                    let _ = queues.delete_message(queue, &m.id, &m.pop_receipt).await;
                }
                // A failure: the host releases the message for another attempt at once.
                Ok(_) => {
                    let _ = queues
                        .update_message(queue, &m.id, &m.pop_receipt, Duration::ZERO, None)
                        .await;
                }
                // Past the execution limit the invocation is abandoned; the message reappears
                // when its visibility lapses.
                Err(_) => {
                    self.timeouts.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
        .await;
        self.executions.lock().unwrap().push(Execution {
            start: start.duration_since(self.epoch),
            duration,
            function: f,
            succeeded,
        });
    }

    /// Delivers one message to the function; true if it succeeded.
    async fn invoke(&self, f: Function, m: &ReceivedMessage) -> bool {
        if let ScanMode::Blog(blog) = &self.mode {
            return blog.execute(&m.text).await.is_ok();
        }
        let Ok(decoded) = MessageEncoding::Base64
            .decode(&m.text)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
        else {
            return false;
        };
        let body = host_payload(f.name(), &decoded, m.dequeue_count, &m.id);
        let request = Request::builder()
            .method("POST")
            .uri(format!("/{}", f.name()))
            .header("content-type", "application/json")
            .body(Body::from(body))
            .expect("valid request");
        match self.router.clone().oneshot(request).await {
            Ok(response) => response.status().is_success(),
            Err(never) => match never {},
        }
    }

    /// The scale controller: desired instances = queue length ÷ target, at most one new
    /// instance per `scale_out_interval_s`, never above `max_instances`.
    pub async fn scale(self: Arc<Self>, queues: CloudQueues) {
        let m = self.model.clone();
        let mut last_added = Instant::now();
        while !self.stopped.load(Ordering::Relaxed) {
            sleep(Duration::from_secs_f64(m.scale_check_interval_s)).await;
            let longest = self
                .functions()
                .iter()
                .map(|f| queues.inner.len(self.queue(*f)))
                .max()
                .unwrap_or(0);
            let desired = ((longest as f64 / m.target_messages_per_instance).ceil() as usize)
                .clamp(1, m.max_instances);
            let current = self.instances.lock().unwrap().len();
            if desired > current
                && last_added.elapsed() >= Duration::from_secs_f64(m.scale_out_interval_s)
            {
                self.add_instance();
                last_added = Instant::now();
            }
        }
    }
}

/// The host's invocation payload for a queue message (docs/custom-handler-protocol.md §3.3).
pub fn host_payload(function: &str, decoded: &str, dequeue_count: u64, id: &str) -> Vec<u8> {
    json!({
        "Data": { "message": serde_json::to_string(decoded).expect("strings serialize") },
        "Metadata": {
            "DequeueCount": dequeue_count.to_string(),
            "Id": format!("\"{id}\""),
            "PopReceipt": "\"pop\"",
            "sys": { "MethodName": function }
        }
    })
    .to_string()
    .into_bytes()
}

//! The Functions hosting plans around tablescan's real router. Consumption: every function on
//! every instance, one vCPU each, and a scale controller that adds at most one instance per 30 s.
//! Flex Consumption: each queue function on its own instances (per-function scaling), CPU by
//! instance memory size, target-based scale-out (desired = queue length / `batchSize`, at most
//! `instances_per_decision` added per decision) under the maximum instance count (per function),
//! optional always-ready instances, and scale-in of idle instances. Both: queue listeners with
//! `batchSize`/`newBatchThreshold` and polling back-off, the execution limit with redelivery.
//! Every queue message is delivered to the real handler (`server::app`) as the host would
//! (payload per docs/custom-handler-protocol.md §3.3). Each instance runs a handler of its own
//! (its own `AppState`: caches, rate-limit pacers and their leases), over the one modelled
//! storage account, as each Azure instance runs its own handler process.

use std::collections::BTreeMap;
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
use super::cloud::{charge_cpu, CloudQueues, Cpu, CPU};
use super::cloud_blob::SimStores;
use super::model::{Flex, Model, Plan};

pub type SimState = Arc<AppState<SimStores>>;

/// Makes a fresh handler (the router over a new `AppState`) for an instance that starts.
pub type NewHandler = Box<dyn Fn() -> Router + Send + Sync>;

/// The queue-triggered functions: tablescan's two, or the blog's single worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Function {
    PrefixScan = 0,
    TableCopy = 1,
    /// The blog's `WorkerQueueFunction` (one queue, dispatch by envelope name).
    Worker = 2,
}

impl Function {
    pub fn name(self) -> &'static str {
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

/// An instance's activity, for billing: executions running now, since when it has been busy
/// (or idle), and its busy time raw and as Flex bills it (per activity period).
#[derive(Debug, Clone, Copy)]
struct Activity {
    running: usize,
    since: Instant,
    busy: Duration,
    billed: Duration,
}

/// One instance: on Consumption it serves every function, on Flex only `function`.
pub struct Instance {
    pub cpu: Arc<Cpu>,
    /// The function this instance serves (Flex); `None` serves all (Consumption).
    pub function: Option<Function>,
    /// Always-ready (Flex): billed a baseline for the whole run, never scaled in.
    pub always_ready: bool,
    /// Scaled in: its listener stops taking messages.
    retired: AtomicBool,
    in_flight: [AtomicUsize; 3],
    slot_freed: [Notify; 3],
    active: Mutex<Activity>,
    /// This instance's own handler (its own caches and pacers).
    handler: Router,
}

impl Instance {
    fn new(cores: f64, function: Option<Function>, always_ready: bool, handler: Router) -> Self {
        Instance {
            cpu: Arc::new(Cpu::with_cores(cores)),
            function,
            always_ready,
            retired: AtomicBool::new(false),
            in_flight: [
                AtomicUsize::new(0),
                AtomicUsize::new(0),
                AtomicUsize::new(0),
            ],
            slot_freed: [Notify::new(), Notify::new(), Notify::new()],
            active: Mutex::new(Activity {
                running: 0,
                since: Instant::now(),
                busy: Duration::ZERO,
                billed: Duration::ZERO,
            }),
            handler,
        }
    }

    fn enter(&self) {
        let mut a = self.active.lock().unwrap();
        if a.running == 0 {
            a.since = Instant::now();
        }
        a.running += 1;
    }

    fn leave(&self) {
        let mut a = self.active.lock().unwrap();
        a.running -= 1;
        if a.running == 0 {
            let period = a.since.elapsed();
            a.busy += period;
            a.billed += Flex::billed_period(period);
            a.since = Instant::now();
        }
    }

    /// Time this instance had at least one execution running (what Consumption bills).
    pub fn busy_time(&self) -> Duration {
        let a = self.active.lock().unwrap();
        a.busy
            + if a.running > 0 {
                a.since.elapsed()
            } else {
                Duration::ZERO
            }
    }

    /// Busy time as Flex bills it: each activity period at least 1 s, rounded up to 100 ms.
    pub fn billed_time(&self) -> Duration {
        let a = self.active.lock().unwrap();
        a.billed
            + if a.running > 0 {
                Flex::billed_period(a.since.elapsed())
            } else {
                Duration::ZERO
            }
    }

    /// How long it has been idle (zero while executing).
    fn idle_for(&self) -> Duration {
        let a = self.active.lock().unwrap();
        if a.running > 0 {
            Duration::ZERO
        } else {
            a.since.elapsed()
        }
    }

    fn is_live(&self) -> bool {
        !self.retired.load(Ordering::Relaxed)
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
    pub plan: Plan,
    /// The Flex settings (unused on Consumption).
    pub flex: Flex,
    /// The state the host itself uses (queue names, the queues it polls): not a handler's.
    pub state: SimState,
    pub new_handler: NewHandler,
    pub mode: ScanMode,
    pub epoch: Instant,
    pub instances: Mutex<Vec<Arc<Instance>>>,
    pub executions: Mutex<Vec<Execution>>,
    /// (seconds since start, live instances) at every change.
    pub instance_timeline: Mutex<Vec<(f64, usize)>>,
    /// Most live instances at once, per function (Flex) or for the app (`"app"`).
    pub peak_instances: Mutex<BTreeMap<&'static str, usize>>,
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

    /// A function app on `plan`, its clock started at `epoch`, with no instances yet.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        model: Arc<Model>,
        plan: Plan,
        flex: Flex,
        state: SimState,
        new_handler: NewHandler,
        mode: ScanMode,
        epoch: Instant,
    ) -> Self {
        Host {
            model,
            plan,
            flex,
            state,
            new_handler,
            mode,
            epoch,
            instances: Mutex::new(Vec::new()),
            executions: Mutex::new(Vec::new()),
            instance_timeline: Mutex::new(Vec::new()),
            peak_instances: Mutex::new(BTreeMap::new()),
            stopped: AtomicBool::new(false),
            running: AtomicUsize::new(0),
            timeouts: AtomicUsize::new(0),
        }
    }

    /// Live instances serving `function` (`None`: all of the app's).
    pub fn live(&self, function: Option<Function>) -> usize {
        self.instances
            .lock()
            .unwrap()
            .iter()
            .filter(|i| i.is_live() && (function.is_none() || i.function == function))
            .count()
    }

    /// Records the live count after a change, and the peaks.
    fn record_instances(&self, function: Option<Function>) {
        let total = self.live(None);
        self.instance_timeline
            .lock()
            .unwrap()
            .push((self.epoch.elapsed().as_secs_f64(), total));
        let mut peaks = self.peak_instances.lock().unwrap();
        let app = peaks.entry("app").or_default();
        *app = (*app).max(total);
        if let Some(f) = function {
            let n = self.live(Some(f));
            let p = peaks.entry(f.name()).or_default();
            *p = (*p).max(n);
        }
    }

    /// Allocates a Consumption instance (every function); it takes messages after the cold start.
    pub fn add_instance(self: &Arc<Self>) {
        let cold = Duration::from_secs_f64(self.model.cold_start_s);
        self.spawn_instance(None, false, cold);
    }

    /// Allocates a Flex instance for one function: always-ready ones are warm at once.
    pub fn add_flex_instance(self: &Arc<Self>, f: Function, always_ready: bool) {
        let cold = if always_ready {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(self.flex.cold_start_s)
        };
        self.spawn_instance(Some(f), always_ready, cold);
    }

    fn spawn_instance(
        self: &Arc<Self>,
        function: Option<Function>,
        always_ready: bool,
        cold: Duration,
    ) {
        let cores = match self.plan {
            Plan::Consumption => self.model.consumption_cores,
            Plan::Flex => self.flex.cores(),
        };
        let handler = (self.new_handler)();
        let instance = Arc::new(Instance::new(cores, function, always_ready, handler));
        self.instances.lock().unwrap().push(instance.clone());
        self.record_instances(function);
        let functions: Vec<Function> = match function {
            Some(f) => vec![f],
            None => self.functions().to_vec(),
        };
        for f in functions {
            let host = self.clone();
            let instance = instance.clone();
            tokio::spawn(async move {
                sleep(cold).await;
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
        while !self.stopped.load(Ordering::Relaxed) && instance.is_live() {
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
        if m.dequeue_count > model.max_dequeue_count {
            // Back after its last delivery timed out: the host poisons it without running it.
            let queues = &self.state.queues;
            CPU.scope(instance.cpu.clone(), async {
                let _ = queues.delete_message(queue, &m.id, &m.pop_receipt).await;
                self.poison(instance, f, &m).await;
            })
            .await;
            return;
        }
        let start = Instant::now();
        instance.enter();
        let limit = Duration::from_secs_f64(model.function_timeout_s);
        let outcome = CPU
            .scope(instance.cpu.clone(), async {
                sleep(Model::ms(model.invocation_overhead_ms)).await;
                charge_cpu(model.cpu_per_execution_ms).await;
                timeout(limit, self.invoke(instance, f, &m)).await
            })
            .await;
        let duration = start.elapsed();
        instance.leave();
        let succeeded = matches!(outcome, Ok(true));
        let queues = &self.state.queues;
        CPU.scope(instance.cpu.clone(), async {
            match outcome {
                Ok(true) => {
                    let _ = queues.delete_message(queue, &m.id, &m.pop_receipt).await;
                }
                // The last failed attempt: the host moves it to the poison queue, whose
                // function settles it (re-queues the item for another round, or fails it).
                Ok(false) if m.dequeue_count >= model.max_dequeue_count => {
                    let _ = queues.delete_message(queue, &m.id, &m.pop_receipt).await;
                    self.poison(instance, f, &m).await;
                }
                // A failure: the host releases the message for another attempt after
                // host.json's visibilityTimeout (default: at once).
                Ok(_) => {
                    let delay = Model::ms(model.failed_visibility_ms);
                    let _ = queues
                        .update_message(queue, &m.id, &m.pop_receipt, delay, None)
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

    /// The poison function's deliveries of a message whose deliveries were all used up (as
    /// `<name>Poison` on `<queue>-poison`, with an id of its own), retried as any failed
    /// delivery up to `maxDequeueCount` times. Modelled at once on the same instance; the
    /// poison queue's own put, receive and delete are not modelled. The blog's app has none.
    async fn poison(&self, instance: &Instance, f: Function, m: &ReceivedMessage) {
        if matches!(self.mode, ScanMode::Blog(_)) {
            return;
        }
        let name = format!("{}Poison", f.name());
        let id = format!("{}-poison", m.id);
        for attempt in 1..=self.model.max_dequeue_count {
            if self.deliver(instance, &name, &m.text, attempt, &id).await {
                return;
            }
            sleep(Model::ms(self.model.failed_visibility_ms)).await;
        }
    }

    /// Delivers one message to the function; true if it succeeded.
    async fn invoke(&self, instance: &Instance, f: Function, m: &ReceivedMessage) -> bool {
        if let ScanMode::Blog(blog) = &self.mode {
            return blog.execute(&m.text).await.is_ok();
        }
        self.deliver(instance, f.name(), &m.text, m.dequeue_count, &m.id)
            .await
    }

    /// Posts one delivery of queue text `text` to function `name` on `instance`'s handler.
    async fn deliver(
        &self,
        instance: &Instance,
        name: &str,
        text: &str,
        dequeue_count: u64,
        id: &str,
    ) -> bool {
        let Ok(decoded) = MessageEncoding::Base64
            .decode(text)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
        else {
            return false;
        };
        let body = host_payload(name, &decoded, dequeue_count, id);
        let request = Request::builder()
            .method("POST")
            .uri(format!("/{name}"))
            .header("content-type", "application/json")
            .body(Body::from(body))
            .expect("valid request");
        match instance.handler.clone().oneshot(request).await {
            Ok(response) => response.status().is_success(),
            Err(never) => match never {},
        }
    }

    /// The plan's scale controller.
    pub async fn scale(self: Arc<Self>, queues: CloudQueues) {
        match self.plan {
            Plan::Consumption => self.scale_consumption(queues).await,
            Plan::Flex => self.scale_flex(queues).await,
        }
    }

    /// Consumption: desired instances = longest queue ÷ target, at most one new instance per
    /// `scale_out_interval_s`, never above `max_instances`.
    async fn scale_consumption(self: Arc<Self>, queues: CloudQueues) {
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
            let current = self.live(None);
            if desired > current
                && last_added.elapsed() >= Duration::from_secs_f64(m.scale_out_interval_s)
            {
                self.add_instance();
                last_added = Instant::now();
            }
        }
    }
}

impl Host {
    /// Flex: per function, desired = queue length ÷ `batchSize` (target executions per
    /// instance for Storage queues), never below its always-ready count. Every decision adds at
    /// most `instances_per_decision` to a function, within the maximum instance count (per
    /// function, on-demand instances only) and the regional quota; an on-demand instance idle for
    /// `scale_in_idle_s` while its function wants fewer is removed.
    async fn scale_flex(self: Arc<Self>, queues: CloudQueues) {
        let target = if self.flex.target_includes_threshold {
            self.model.batch_size as f64 + self.model.new_batch_threshold as f64
        } else {
            self.model.batch_size as f64
        }
        .max(1.0);
        let interval = Duration::from_secs_f64(self.flex.scale_interval_s);
        let idle = Duration::from_secs_f64(self.flex.scale_in_idle_s);
        while !self.stopped.load(Ordering::Relaxed) {
            sleep(interval).await;
            for &f in self.functions() {
                let length = queues.inner.len(self.queue(f));
                let desired =
                    ((length as f64 / target).ceil() as usize).max(self.flex.always_ready);
                let live = self.live(Some(f));
                if desired > live {
                    // The maximum instance count caps each function's on-demand instances; the
                    // regional quota caps all of them, always-ready ones included.
                    let room = self
                        .flex
                        .instance_cap()
                        .saturating_sub(self.on_demand(f))
                        .min(self.flex.quota_instances().saturating_sub(self.live(None)));
                    let add = (desired - live)
                        .min(self.flex.instances_per_decision)
                        .min(room);
                    for _ in 0..add {
                        self.add_flex_instance(f, false);
                    }
                } else if desired < live {
                    self.scale_in(f, live - desired, idle);
                }
            }
        }
    }

    /// Live on-demand (not always-ready) instances serving `f`.
    fn on_demand(&self, f: Function) -> usize {
        self.instances
            .lock()
            .unwrap()
            .iter()
            .filter(|i| i.is_live() && i.function == Some(f) && !i.always_ready)
            .count()
    }

    /// Retires up to `count` on-demand instances of `f` that have been idle for `idle`.
    fn scale_in(&self, f: Function, count: usize, idle: Duration) {
        let retired = {
            let all = self.instances.lock().unwrap();
            let mut retired = 0;
            for i in all.iter() {
                if retired == count {
                    break;
                }
                if i.is_live() && i.function == Some(f) && !i.always_ready && i.idle_for() >= idle {
                    i.retired.store(true, Ordering::Relaxed);
                    retired += 1;
                }
            }
            retired
        };
        if retired > 0 {
            self.record_instances(Some(f));
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

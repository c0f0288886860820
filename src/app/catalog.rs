//! The function catalog: every function the app serves, declared once. The router is built
//! from it (`server::app`: path and method from the trigger, handler from [`Handler`]), and
//! `function-defs/<Name>/function.json` must declare the same (tests check both ways). Adding
//! a function: an entry here, its module in `functions/`, its folder in `function-defs/`.

/// How the Functions host reaches a function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// HTTP-only function, passed as the raw request to `/api/{route}`
    /// (`enableProxyingHttpRequest`, or `enableForwardingHttpRequest` on older hosts).
    Http {
        method: &'static str,
        route: &'static str,
    },
    /// Queue trigger on the queue named by an app setting plus `suffix` (`""`, or `"-poison"` for
    /// the queue the host moves a message to after its last failed delivery); the host POSTs
    /// `/{FunctionName}`.
    Queue {
        queue_setting: &'static str,
        suffix: &'static str,
    },
    /// Timer trigger on the NCRONTAB schedule the app setting names (`%setting%` in
    /// function.json); the host POSTs `/{FunctionName}` with the timer's state as `Data.timer`.
    Timer { schedule_setting: &'static str },
}

/// What answers a function's invocations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handler {
    StartScan,
    ListScans,
    GetScan,
    CancelScan,
    /// Finds rows through a secondary index (`functions::lookup`).
    Lookup,
    /// Runs queue work of this kind (`work::run`).
    Work(WorkKind),
    /// Settles poisoned queue work of this kind (`AppState::settle_poisoned`).
    Poison(WorkKind),
    /// Removes an ended scan's rows once their retention ends (`functions::scan_cleanup`).
    Cleanup,
    /// `PUT /api/schedules/{name}` (`schedule::api`).
    PutSchedule,
    ListSchedules,
    GetSchedule,
    DeleteSchedule,
    /// Starts the scans that are due (`schedule::fire`).
    Scheduler,
}

/// The kinds of queue work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkKind {
    /// Scan steps (`StepMessage`).
    Step,
    /// Driver work items (`ItemMessage`): copy items and every other driver's work, run by
    /// `TableCopy` (named for the first driver; deployments depend on the name).
    Copy,
}

/// One function of the app.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FunctionSpec {
    pub name: &'static str,
    pub trigger: Trigger,
    pub handler: Handler,
}

impl FunctionSpec {
    /// The path the Functions host calls: `/api/{route}` for HTTP functions (forwarded
    /// requests), `/{name}` for queue functions.
    pub fn path(&self) -> String {
        match self.trigger {
            Trigger::Http { route, .. } => format!("/api/{route}"),
            Trigger::Queue { .. } | Trigger::Timer { .. } => format!("/{}", self.name),
        }
    }

    /// The HTTP method the host calls the path with.
    pub fn method(&self) -> &'static str {
        match self.trigger {
            Trigger::Http { method, .. } => method,
            Trigger::Queue { .. } | Trigger::Timer { .. } => "POST",
        }
    }
}

/// App setting naming the prefix-scan step queue.
pub const PREFIX_SCAN_QUEUE_SETTING: &str = "TABLESCAN_PREFIXSCAN_QUEUE";
/// App setting naming the table-copy work queue.
pub const TABLE_COPY_QUEUE_SETTING: &str = "TABLESCAN_TABLECOPY_QUEUE";
/// The host's poison queue of a queue: `<queue>-poison`.
pub const POISON_SUFFIX: &str = "-poison";
/// App setting holding the `Scheduler` timer's NCRONTAB schedule. Deployments set it (a `%…%`
/// token that resolves to nothing stops the Functions host from indexing the function):
/// [`DEFAULT_SCHEDULER_SCHEDULE`] in infra/main.bicep and local.settings.sample.json.
pub const SCHEDULER_SCHEDULE_SETTING: &str = "TABLESCAN_SCHEDULER_SCHEDULE";
/// Every minute, at second 0.
pub const DEFAULT_SCHEDULER_SCHEDULE: &str = "0 * * * * *";
/// The queue of retention cleanups: `<scan step queue>-cleanup` (no setting of its own).
pub const CLEANUP_SUFFIX: &str = "-cleanup";

pub const FUNCTIONS: &[FunctionSpec] = &[
    FunctionSpec {
        name: "StartScan",
        trigger: Trigger::Http {
            method: "POST",
            route: "scans",
        },
        handler: Handler::StartScan,
    },
    FunctionSpec {
        name: "ListScans",
        trigger: Trigger::Http {
            method: "GET",
            route: "scans",
        },
        handler: Handler::ListScans,
    },
    FunctionSpec {
        name: "GetScan",
        trigger: Trigger::Http {
            method: "GET",
            route: "scans/{id}",
        },
        handler: Handler::GetScan,
    },
    FunctionSpec {
        name: "CancelScan",
        trigger: Trigger::Http {
            method: "DELETE",
            route: "scans/{id}",
        },
        handler: Handler::CancelScan,
    },
    FunctionSpec {
        name: "Lookup",
        trigger: Trigger::Http {
            method: "POST",
            route: "lookups",
        },
        handler: Handler::Lookup,
    },
    FunctionSpec {
        name: "PrefixScan",
        trigger: Trigger::Queue {
            queue_setting: PREFIX_SCAN_QUEUE_SETTING,
            suffix: "",
        },
        handler: Handler::Work(WorkKind::Step),
    },
    FunctionSpec {
        name: "TableCopy",
        trigger: Trigger::Queue {
            queue_setting: TABLE_COPY_QUEUE_SETTING,
            suffix: "",
        },
        handler: Handler::Work(WorkKind::Copy),
    },
    // A message whose every delivery failed without the handler recording it (the process was
    // killed, or storage stayed unreachable) lands in the poison queue; these record the work
    // item as failed so its scan ends instead of waiting for it forever.
    FunctionSpec {
        name: "PrefixScanPoison",
        trigger: Trigger::Queue {
            queue_setting: PREFIX_SCAN_QUEUE_SETTING,
            suffix: POISON_SUFFIX,
        },
        handler: Handler::Poison(WorkKind::Step),
    },
    FunctionSpec {
        name: "TableCopyPoison",
        trigger: Trigger::Queue {
            queue_setting: TABLE_COPY_QUEUE_SETTING,
            suffix: POISON_SUFFIX,
        },
        handler: Handler::Poison(WorkKind::Copy),
    },
    // Queued once by the end of each scan (delayed by the work retention): removes the scan's
    // work rows, then its record (docs/retention.md).
    FunctionSpec {
        name: "ScanCleanup",
        trigger: Trigger::Queue {
            queue_setting: PREFIX_SCAN_QUEUE_SETTING,
            suffix: CLEANUP_SUFFIX,
        },
        handler: Handler::Cleanup,
    },
    // Schedules (docs/schedules.md): the API, and the timer that starts what is due.
    FunctionSpec {
        name: "PutSchedule",
        trigger: Trigger::Http {
            method: "PUT",
            route: "schedules/{name}",
        },
        handler: Handler::PutSchedule,
    },
    FunctionSpec {
        name: "ListSchedules",
        trigger: Trigger::Http {
            method: "GET",
            route: "schedules",
        },
        handler: Handler::ListSchedules,
    },
    FunctionSpec {
        name: "GetSchedule",
        trigger: Trigger::Http {
            method: "GET",
            route: "schedules/{name}",
        },
        handler: Handler::GetSchedule,
    },
    FunctionSpec {
        name: "DeleteSchedule",
        trigger: Trigger::Http {
            method: "DELETE",
            route: "schedules/{name}",
        },
        handler: Handler::DeleteSchedule,
    },
    FunctionSpec {
        name: "Scheduler",
        trigger: Trigger::Timer {
            schedule_setting: SCHEDULER_SCHEDULE_SETTING,
        },
        handler: Handler::Scheduler,
    },
];

//! Timer triggers (`timerTrigger`), as the timer extension runs them for a custom handler
//! (docs/custom-handler-protocol.md §12): at each occurrence of the binding's NCRONTAB schedule
//! (UTC, with seconds; `%AppSetting%` resolved at start), `POST /{Function}` with
//! `{"Data": {"<binding>": <TimerInfo>}, "Metadata": {"sys": …}}`, where TimerInfo is
//! `{"Schedule": {"AdjustForDST": true}, "ScheduleStatus": {"Last", "Next", "LastUpdated"} | null,
//! "IsPastDue": false}`.
//!
//! Local choices (the real host differs):
//! - EVERY instance runs the timer; Azure runs a timer on one instance at a time (a singleton
//!   lock). Several instances therefore fire each occurrence once each: the duplicate firings an
//!   app must survive anyway (a lock lost mid-invocation, a restart) are the normal case here;
//! - the schedule status lives in memory (no storage monitor): `Last` starts at .NET's
//!   `DateTime.MinValue` and `IsPastDue` is always false (a missed occurrence is not replayed);
//! - only NCRONTAB schedules; the `hh:mm:ss` TimeSpan form is refused at start.
//!
//! Invariant: one listener per (instance, timer function) fires each occurrence at most once
//! (it never fires an occurrence at or before the last one it fired, whatever its sleep's
//! precision), and stops firing when its instance stops.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use time::OffsetDateTime;
use tokio::sync::watch;

use super::config::{resolve_tokens, AppConfig, AppSettings, ConfigError, LogLevel, TriggerConfig};
use super::invoke::Invoker;
use super::log::{user_category, HostLog};
use super::payload::SysData;
use crate::cron::Cron;

/// A timer-triggered function with its schedule resolved and parsed.
#[derive(Debug, Clone)]
pub struct TimerFunction {
    pub function: String,
    pub binding: String,
    pub schedule: String,
    pub cron: Cron,
    pub run_on_startup: bool,
    /// `useMonitor`, turned off (as the extension does) for a schedule firing more than once a
    /// minute: then `ScheduleStatus` is `null`.
    pub use_monitor: bool,
}

/// Every timer function of the app, resolved against the app settings. A timer whose schedule
/// does not resolve or parse is "in error", as the host's indexing marks one function (its
/// `FunctionErrors`): the error is logged and returned, that function never fires, every other
/// function runs.
pub fn resolve_timers(
    app: &AppConfig,
    settings: &AppSettings,
) -> (Vec<TimerFunction>, Vec<ConfigError>) {
    let mut timers = Vec::new();
    let mut errors = Vec::new();
    for function in &app.functions {
        let TriggerConfig::Timer(t) = &function.trigger else {
            continue;
        };
        let field = format!("bindings({}).schedule", t.name);
        let resolved = resolve_tokens(&t.schedule, "schedule", settings).and_then(|schedule| {
            Cron::parse(&schedule).map(|cron| (schedule.clone(), cron)).map_err(|e| {
                format!(
                    "{schedule:?} is not an NCRONTAB expression with seconds ({e}); this host does not run TimeSpan schedules"
                )
            })
        });
        let (schedule, cron) = match resolved {
            Ok(found) => found,
            Err(e) => {
                errors.push(ConfigError::new(&function.file, field, e));
                continue;
            }
        };
        let use_monitor = t.use_monitor && !fires_more_than_once_a_minute(&schedule, &cron);
        timers.push(TimerFunction {
            function: function.name.clone(),
            binding: t.name.clone(),
            schedule,
            cron,
            run_on_startup: t.run_on_startup,
            use_monitor,
        });
    }
    (timers, errors)
}

/// The extension's rule: every field but the seconds is `*` and the next minute holds more
/// than one occurrence.
fn fires_more_than_once_a_minute(schedule: &str, cron: &Cron) -> bool {
    if !schedule.split_whitespace().skip(1).all(|f| f == "*") {
        return false;
    }
    let now = OffsetDateTime::now_utc();
    let first = cron.next_after(now);
    let second = first.and_then(|f| cron.next_after(f));
    second.is_some_and(|s| s < now + time::Duration::minutes(1))
}

/// The timer's schedule status, as the function receives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScheduleStatus {
    /// The previous occurrence fired (`None`: .NET's `DateTime.MinValue`, none yet).
    pub last: Option<OffsetDateTime>,
    /// The occurrence being fired.
    pub next: OffsetDateTime,
    pub last_updated: Option<OffsetDateTime>,
}

/// A `DateTime` of kind Local on a UTC machine as Json.NET writes it: seconds, then up to 7
/// fractional digits without trailing zeros, then `+00:00`.
pub fn dotnet_local(t: Option<OffsetDateTime>) -> String {
    let Some(t) = t.map(|t| t.to_offset(time::UtcOffset::UTC)) else {
        return "0001-01-01T00:00:00+00:00".into();
    };
    let mut text = format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}",
        t.year(),
        t.month() as u8,
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    );
    let ticks = t.nanosecond() / 100;
    if ticks > 0 {
        text.push_str(format!(".{ticks:07}").trim_end_matches('0'));
    }
    text + "+00:00"
}

/// The body of a timer invocation (`JObject.FromObject(TimerInfo)` under `Data.<binding>`; the
/// `TimerTrigger` binding data is left out of `Metadata`, as every key ending in "trigger" is).
pub fn timer_payload(
    binding: &str,
    status: Option<&ScheduleStatus>,
    is_past_due: bool,
    sys: &SysData,
) -> String {
    let status = status.map_or(Value::Null, |s| {
        json!({
            "Last": dotnet_local(s.last),
            "Next": dotnet_local(Some(s.next)),
            "LastUpdated": dotnet_local(s.last_updated),
        })
    });
    let mut data = serde_json::Map::new();
    data.insert(
        binding.to_string(),
        json!({
            "Schedule": {"AdjustForDST": true},
            "ScheduleStatus": status,
            "IsPastDue": is_past_due,
        }),
    );
    json!({"Data": data, "Metadata": {"sys": sys}}).to_string()
}

/// Runs one timer on one instance until `stop` turns true.
pub async fn run_timer(
    timer: Arc<TimerFunction>,
    invoker: Arc<Invoker>,
    log: HostLog,
    label: String,
    mut stop: watch::Receiver<bool>,
) {
    let mut fired: Option<OffsetDateTime> = None;
    let mut updated: Option<OffsetDateTime> = None;
    if timer.run_on_startup {
        let now = OffsetDateTime::now_utc();
        let status = ScheduleStatus {
            last: None,
            next: timer.cron.next_after(now).unwrap_or(now),
            last_updated: None,
        };
        invoke(&timer, &invoker, &log, &label, &status, "RunOnStartup").await;
    }
    loop {
        let now = OffsetDateTime::now_utc();
        let after = fired.map_or(now, |f| f.max(now));
        let Some(next) = timer.cron.next_after(after) else {
            log.warn(format!(
                "{label} timer of '{}': schedule {:?} has no further occurrence",
                timer.function, timer.schedule
            ));
            return;
        };
        let wait = Duration::try_from(next - now).unwrap_or(Duration::ZERO);
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        // Never before the occurrence (a sleep may end a little early).
        let early = next - OffsetDateTime::now_utc();
        if early > time::Duration::ZERO {
            tokio::time::sleep(Duration::try_from(early).unwrap_or(Duration::ZERO)).await;
        }
        if *stop.borrow() {
            return;
        }
        let status = ScheduleStatus {
            last: fired,
            next,
            last_updated: updated,
        };
        invoke(&timer, &invoker, &log, &label, &status, "Timer").await;
        fired = Some(next);
        updated = Some(OffsetDateTime::now_utc());
    }
}

async fn invoke(
    timer: &TimerFunction,
    invoker: &Invoker,
    log: &HostLog,
    label: &str,
    status: &ScheduleStatus,
    reason: &str,
) {
    let id = uuid::Uuid::new_v4().to_string();
    let sys = SysData::now(&timer.function);
    let shown = timer.use_monitor.then_some(status);
    let body = timer_payload(&timer.binding, shown, false, &sys);
    let tag = format!("{label} [{}] [{id}]", timer.function);
    log.info(format!(
        "{tag} Executing '{}' (Reason='{reason}', due {})",
        timer.function,
        dotnet_local(Some(status.next))
    ));
    let started = std::time::Instant::now();
    match invoker.invoke_payload(&timer.function, &id, body).await {
        Ok(result) => {
            for line in &result.logs {
                log.category(
                    LogLevel::Information,
                    &user_category(&timer.function),
                    &tag,
                    line,
                );
            }
            log.info(format!(
                "{tag} Executed '{}' (Succeeded, {} ms)",
                timer.function,
                started.elapsed().as_millis()
            ));
        }
        // A failed timer invocation is logged; the schedule goes on (no retry).
        Err(e) => log.error(format!(
            "{tag} Executed '{}' (Failed, {} ms): {e}",
            timer.function,
            started.elapsed().as_millis()
        )),
    }
}

#[cfg(test)]
mod tests {
    use time::macros::datetime;

    use super::*;

    #[test]
    fn the_payload_is_the_serialized_timer_info() {
        let sys = SysData {
            method_name: "Scheduler".into(),
            utc_now: "2026-11-28T19:12:00.0012345Z".into(),
            rand_guid: "00000000-0000-0000-0000-000000000000".into(),
        };
        let status = ScheduleStatus {
            last: None,
            next: datetime!(2026-11-28 19:12:00 UTC),
            last_updated: Some(datetime!(2026-11-28 19:11:00.25 UTC)),
        };
        let body: Value =
            serde_json::from_str(&timer_payload("timer", Some(&status), false, &sys)).unwrap();
        assert_eq!(
            body,
            json!({
                "Data": {"timer": {
                    "Schedule": {"AdjustForDST": true},
                    "ScheduleStatus": {
                        "Last": "0001-01-01T00:00:00+00:00",
                        "Next": "2026-11-28T19:12:00+00:00",
                        "LastUpdated": "2026-11-28T19:11:00.25+00:00",
                    },
                    "IsPastDue": false,
                }},
                "Metadata": {"sys": {
                    "MethodName": "Scheduler",
                    "UtcNow": "2026-11-28T19:12:00.0012345Z",
                    "RandGuid": "00000000-0000-0000-0000-000000000000",
                }},
            })
        );
        let body: Value = serde_json::from_str(&timer_payload("t", None, true, &sys)).unwrap();
        assert_eq!(body["Data"]["t"]["ScheduleStatus"], Value::Null);
        assert_eq!(body["Data"]["t"]["IsPastDue"], true);
    }

    #[test]
    fn sub_minute_schedules_lose_the_monitor() {
        let every = |s: &str| fires_more_than_once_a_minute(s, &Cron::parse(s).unwrap());
        assert!(every("*/5 * * * * *"));
        assert!(!every("0 * * * * *"));
        assert!(!every("*/5 0 * * * *"));
    }
}

//! The operator's ceiling: what a request may lower but never raise.

use std::time::Duration;

use crate::network::HostRule;
use crate::policy::{MIB, OutputOverflow, Policy, PolicyError};
use crate::spec::PolicySpec;

impl PolicySpec {
    /// Checks that every field this spec sets stays within `ceiling`, the
    /// most an operator allows: limits no higher, hosts only among the
    /// ceiling's, extra packages only among the ceiling's, no isolation
    /// layer lowered that the ceiling keeps, the
    /// same backend, and no `truncate` where the ceiling says `kill`. The
    /// error names the first field that is out of bounds.
    ///
    /// This checks bounds only; [`Policy::with_spec`] still checks the
    /// values themselves (a zero, a NaN) against the host.
    pub fn check_within(&self, ceiling: &Policy) -> Result<(), PolicyError> {
        let l = &ceiling.limits;
        let n = &ceiling.network;
        seconds_within("timeout_s", self.timeout_s, l.wall_time)?;
        seconds_within("cpu_time_s", self.cpu_time_s, l.cpu_time)?;
        within("memory_mb", self.memory_mb, l.memory_bytes / MIB)?;
        within("pids", self.pids.map(u64::from), l.pids.into())?;
        if let Some(cpus) = self.cpus
            && !at_most(cpus, l.cpus)
        {
            return Err(above("cpus", cpus, l.cpus));
        }
        within("disk_mb", self.disk_mb, l.disk_bytes / MIB)?;
        within("disk_inodes", self.disk_inodes, l.disk_inodes)?;
        within("max_output_bytes", self.max_output_bytes, l.output_bytes)?;
        within("max_file_bytes", self.max_file_bytes, l.file_bytes)?;
        within("max_files_total_bytes", self.max_files_total_bytes, l.files_total_bytes)?;
        within("open_files", self.open_files.map(u64::from), l.open_files.into())?;
        within("max_network_bytes_out", self.max_network_bytes_out, n.max_bytes_out)?;
        within("max_network_bytes_in", self.max_network_bytes_in, n.max_bytes_in)?;
        within("max_connections", self.max_connections.map(u64::from), n.max_connections.into())?;
        if self.on_output_limit == Some(OutputOverflow::Truncate) && l.output_overflow == OutputOverflow::Kill {
            return Err(PolicyError::NotAllowed {
                field: "on_output_limit",
                message: "the operator stops runs at the output limit (kill); a request cannot ask to go on".to_owned(),
            });
        }
        for entry in self.allow_hosts.iter().flatten() {
            let rule =
                HostRule::parse(entry).map_err(|source| PolicyError::BadHostRule { entry: entry.clone(), source })?;
            if !n.allow.iter().any(|allowed| allowed.covers(&rule)) {
                let allowed: Vec<String> = n.allow.iter().map(HostRule::to_string).collect();
                return Err(PolicyError::NotAllowed {
                    field: "allow_hosts",
                    message: if allowed.is_empty() {
                        format!("{entry:?} is not allowed: the operator allows no network")
                    } else {
                        format!("{entry:?} is not among the hosts the operator allows ({})", allowed.join(", "))
                    },
                });
            }
        }
        if let Some(backend) = &self.backend
            && backend != &ceiling.backend.to_string()
        {
            return Err(PolicyError::NotAllowed {
                field: "backend",
                message: format!("{backend:?} is not the backend the operator runs ({})", ceiling.backend),
            });
        }
        for package in self.with_packages.iter().flatten() {
            if !ceiling.with_packages.contains(package.trim()) {
                let allowed: Vec<&str> = ceiling.with_packages.iter().map(String::as_str).collect();
                return Err(PolicyError::NotAllowed {
                    field: "with_packages",
                    message: if allowed.is_empty() {
                        format!("{package:?} is not allowed: the operator allows no extra packages")
                    } else {
                        format!(
                            "{package:?} is not among the extra packages the operator allows ({})",
                            allowed.join(", ")
                        )
                    },
                });
            }
        }
        for name in self.allow_degraded.iter().flatten() {
            if !ceiling.allow_degraded.iter().any(|layer| layer.name() == name) {
                return Err(PolicyError::NotAllowed {
                    field: "allow_degraded",
                    message: format!("the operator does not allow running without {name}"),
                });
            }
        }
        Ok(())
    }
}

fn within(field: &'static str, value: Option<u64>, ceiling: u64) -> Result<(), PolicyError> {
    match value {
        Some(value) if value > ceiling => Err(above(field, value, ceiling)),
        _ => Ok(()),
    }
}

fn seconds_within(field: &'static str, value: Option<f64>, ceiling: Duration) -> Result<(), PolicyError> {
    match value {
        Some(seconds) if !at_most(seconds, ceiling.as_secs_f64()) => Err(above(field, seconds, ceiling.as_secs_f64())),
        _ => Ok(()),
    }
}

/// `value <= ceiling`, false for a NaN: a NaN is never within bounds.
fn at_most(value: f64, ceiling: f64) -> bool {
    matches!(value.partial_cmp(&ceiling), Some(std::cmp::Ordering::Less | std::cmp::Ordering::Equal))
}

fn above(field: &'static str, value: impl ToString, ceiling: impl ToString) -> PolicyError {
    PolicyError::AboveCeiling { field, value: value.to_string(), ceiling: ceiling.to_string() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::HostFacts;

    fn host() -> HostFacts {
        HostFacts { memory_bytes: 8 << 30, cpus: 2, pid_max: 32768, nr_open: 1 << 20 }
    }

    fn ceiling() -> Policy {
        let spec = PolicySpec {
            timeout_s: Some(30.0),
            memory_mb: Some(1024),
            allow_hosts: Some(vec!["*.example.org".into(), "pypi.org:443".into()]),
            allow_degraded: Some(vec!["landlock".into()]),
            on_output_limit: Some(OutputOverflow::Kill),
            with_packages: Some(vec!["statsmodels".into()]),
            ..PolicySpec::default()
        };
        Policy::from_spec(&spec, &host()).unwrap()
    }

    #[test]
    fn lower_or_equal_is_accepted() {
        let spec = PolicySpec {
            timeout_s: Some(30.0),
            cpu_time_s: Some(1.5),
            memory_mb: Some(64),
            pids: Some(8),
            cpus: Some(0.5),
            max_output_bytes: Some(10),
            on_output_limit: Some(OutputOverflow::Kill),
            allow_hosts: Some(vec!["files.example.org".into(), "pypi.org:443".into()]),
            allow_degraded: Some(vec!["landlock".into()]),
            backend: Some("linux".into()),
            with_packages: Some(vec!["statsmodels".into()]),
            ..PolicySpec::default()
        };
        spec.check_within(&ceiling()).unwrap();
        PolicySpec::default().check_within(&ceiling()).unwrap();
        ceiling().to_spec().check_within(&ceiling()).unwrap();
    }

    #[test]
    fn every_raise_names_its_field() {
        let cases: Vec<(PolicySpec, &str)> = vec![
            (PolicySpec { timeout_s: Some(30.5), ..Default::default() }, "timeout_s"),
            (PolicySpec { timeout_s: Some(f64::NAN), ..Default::default() }, "timeout_s"),
            (PolicySpec { cpu_time_s: Some(21.0), ..Default::default() }, "cpu_time_s"),
            (PolicySpec { memory_mb: Some(1025), ..Default::default() }, "memory_mb"),
            (PolicySpec { pids: Some(65), ..Default::default() }, "pids"),
            (PolicySpec { cpus: Some(1.5), ..Default::default() }, "cpus"),
            (PolicySpec { disk_mb: Some(65), ..Default::default() }, "disk_mb"),
            (PolicySpec { disk_inodes: Some(4097), ..Default::default() }, "disk_inodes"),
            (PolicySpec { max_output_bytes: Some(2 << 20), ..Default::default() }, "max_output_bytes"),
            (PolicySpec { max_file_bytes: Some(17 << 20), ..Default::default() }, "max_file_bytes"),
            (PolicySpec { max_files_total_bytes: Some(65 << 20), ..Default::default() }, "max_files_total_bytes"),
            (PolicySpec { open_files: Some(257), ..Default::default() }, "open_files"),
            (PolicySpec { max_network_bytes_out: Some(u64::MAX), ..Default::default() }, "max_network_bytes_out"),
            (PolicySpec { max_network_bytes_in: Some(u64::MAX), ..Default::default() }, "max_network_bytes_in"),
            (PolicySpec { max_connections: Some(65), ..Default::default() }, "max_connections"),
            (PolicySpec { on_output_limit: Some(OutputOverflow::Truncate), ..Default::default() }, "on_output_limit"),
            (PolicySpec { allow_hosts: Some(vec!["example.org".into()]), ..Default::default() }, "allow_hosts"),
            (PolicySpec { allow_hosts: Some(vec!["pypi.org:80".into()]), ..Default::default() }, "allow_hosts"),
            (PolicySpec { allow_hosts: Some(vec!["169.254.169.254".into()]), ..Default::default() }, "allow_hosts"),
            (PolicySpec { allow_hosts: Some(vec!["http://x".into()]), ..Default::default() }, "allow_hosts"),
            (PolicySpec { backend: Some("wasm".into()), ..Default::default() }, "backend"),
            (PolicySpec { allow_degraded: Some(vec!["cgroups".into()]), ..Default::default() }, "allow_degraded"),
            (PolicySpec { with_packages: Some(vec!["torch".into()]), ..Default::default() }, "with_packages"),
        ];
        for (spec, field) in cases {
            let error = spec.check_within(&ceiling()).unwrap_err();
            assert_eq!(error.field(), field, "{error}");
            assert!(error.to_string().contains(field), "{error} should name {field}");
        }
    }

    #[test]
    fn a_ceiling_without_network_refuses_every_host() {
        let spec = PolicySpec { allow_hosts: Some(vec!["example.com".into()]), ..Default::default() };
        let error = spec.check_within(&Policy::default()).unwrap_err();
        assert!(error.to_string().contains("no network"), "{error}");
        // An empty list asks for nothing.
        PolicySpec { allow_hosts: Some(vec![]), ..Default::default() }.check_within(&Policy::default()).unwrap();
    }

    #[test]
    fn the_message_says_the_ceiling() {
        let error = PolicySpec { memory_mb: Some(4096), ..Default::default() }.check_within(&ceiling()).unwrap_err();
        assert_eq!(error.to_string(), "memory_mb is 4096, above the operator's ceiling of 1024; ask for at most 1024");
    }
}

//! Steering luna's share of a port's traffic (docs/bifurcation.md): in the NIC with
//! `rte_flow` rules and flow isolation (a bifurcated driver such as mlx5 keeps everything
//! else for the kernel netdev), or in software (luna's poll loop classifies every frame
//! and the exception path hands the kernel its frames).
//!
//! The decision is here, free of DPDK, so it is unit-tested: [`SteeringPlan::new`] says
//! what to try from the configuration, [`SteeringPlan::outcome`] what the install result
//! means. [`super::dpdk::DpdkDevice::open_all_then`] carries it out (isolation before
//! `rte_eth_dev_configure`, the rules after start) through `bifurcation::install`, which
//! prints the one fallback line.

use bifurcation::RuleSet;

/// `device.steering` in r2c's configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SteeringMode {
    /// Try the NIC; fall back to software (one log line, `steering_fallbacks` = 1).
    #[default]
    Auto,
    /// The NIC or nothing: a port that cannot steer fails to open.
    Hardware,
    /// Never try the NIC (one log line says so).
    Software,
}

impl SteeringMode {
    /// From the configuration's word.
    pub fn parse(s: &str) -> Option<SteeringMode> {
        match s {
            "auto" => Some(SteeringMode::Auto),
            "hardware" => Some(SteeringMode::Hardware),
            "software" => Some(SteeringMode::Software),
            _ => None,
        }
    }
}

/// What a port is asked to do with luna's rules (`DpdkDeviceConfig::steering`).
#[derive(Debug, Clone)]
pub struct SteeringRequest {
    /// How hard to try.
    pub mode: SteeringMode,
    /// The compiled rules of the traffic model (`bifurcation::rules::compile`).
    pub rules: RuleSet,
}

/// What to do at port bring-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SteeringPlan {
    /// No traffic model: luna owns the port; no rules, no isolation, no message.
    OwnPort,
    /// Software by configuration: no rte_flow call, one line.
    Software,
    /// Isolate before configure, install after start; `strict`: a failure is an error.
    TryHardware {
        /// `device.steering = "hardware"`.
        strict: bool,
    },
}

/// How the port ended up steering (its `steering_hw` / `steering_fallbacks` stats).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Steering {
    /// No traffic model (luna owns the port).
    OwnPort,
    /// In the NIC: this many rules.
    Hardware {
        /// Rules created.
        rules: usize,
    },
    /// In software; `fell_back`: hardware was tried and refused (the message says why).
    Software {
        /// Hardware was tried first.
        fell_back: bool,
        /// The one line printed.
        message: String,
    },
}

impl Steering {
    /// 1 when the NIC steers.
    pub fn hw(&self) -> u64 {
        u64::from(matches!(self, Steering::Hardware { .. }))
    }

    /// 1 when hardware was tried and luna fell back to software.
    pub fn fallbacks(&self) -> u64 {
        u64::from(matches!(
            self,
            Steering::Software {
                fell_back: true,
                ..
            }
        ))
    }
}

impl SteeringPlan {
    /// The plan for a port: `request` is `None` without a traffic model.
    pub fn new(request: Option<&SteeringRequest>) -> SteeringPlan {
        match request.map(|r| r.mode) {
            None => SteeringPlan::OwnPort,
            Some(SteeringMode::Software) => SteeringPlan::Software,
            Some(SteeringMode::Auto) => SteeringPlan::TryHardware { strict: false },
            Some(SteeringMode::Hardware) => SteeringPlan::TryHardware { strict: true },
        }
    }

    /// Whether to call `rte_flow_isolate` before configuring the port.
    pub fn isolates(&self) -> bool {
        matches!(self, SteeringPlan::TryHardware { .. })
    }

    /// The steering after the install step. `installed`: `Ok(rules)` when every rule is
    /// in the NIC, `Err(message)` with bifurcation's fallback line when not (`None`: not
    /// tried). `Err` from here: a strict plan that could not steer.
    pub fn outcome(
        &self,
        port: &str,
        installed: Option<Result<usize, String>>,
    ) -> Result<Steering, String> {
        match (self, installed) {
            (SteeringPlan::OwnPort, _) => Ok(Steering::OwnPort),
            (SteeringPlan::Software, _) => Ok(Steering::Software {
                fell_back: false,
                message: format!(
                    "bifurcation: port {port}: steering = \"software\" (configured): luna classifies every frame in its poll loop and hands the kernel's to the exception interface"
                ),
            }),
            (SteeringPlan::TryHardware { .. }, Some(Ok(rules))) => {
                Ok(Steering::Hardware { rules })
            }
            (SteeringPlan::TryHardware { strict: true }, Some(Err(message))) => Err(format!(
                "{message} (device.steering = \"hardware\" refuses the fallback: use \"auto\")"
            )),
            (SteeringPlan::TryHardware { strict: false }, Some(Err(message))) => {
                Ok(Steering::Software {
                    fell_back: true,
                    message,
                })
            }
            (SteeringPlan::TryHardware { strict }, None) => {
                let message = format!(
                    "bifurcation: port {port}: hardware steering was not attempted; luna classifies every frame in its poll loop"
                );
                if *strict {
                    Err(message)
                } else {
                    Ok(Steering::Software {
                        fell_back: true,
                        message,
                    })
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bifurcation::{KernelPorts, TrafficConfig};

    fn request(mode: SteeringMode) -> SteeringRequest {
        let model = TrafficConfig {
            listen_tcp: vec![7000],
            apps: vec![bifurcation::model::AppConfig {
                name: "t".into(),
                ports: Default::default(),
                threads: Some(2),
                queues: None,
            }],
            ..TrafficConfig::default()
        }
        .validate(&KernelPorts::parse("32768 60999", "").unwrap())
        .unwrap();
        SteeringRequest {
            mode,
            rules: bifurcation::rules::compile(&model),
        }
    }

    #[test]
    fn plan_follows_the_model_and_the_mode() {
        assert_eq!(SteeringPlan::new(None), SteeringPlan::OwnPort);
        assert!(!SteeringPlan::new(None).isolates());
        let p = SteeringPlan::new(Some(&request(SteeringMode::Software)));
        assert_eq!(p, SteeringPlan::Software);
        assert!(!p.isolates());
        let p = SteeringPlan::new(Some(&request(SteeringMode::Auto)));
        assert_eq!(p, SteeringPlan::TryHardware { strict: false });
        assert!(p.isolates());
        let p = SteeringPlan::new(Some(&request(SteeringMode::Hardware)));
        assert_eq!(p, SteeringPlan::TryHardware { strict: true });
        assert!(!request(SteeringMode::Auto).rules.rules.is_empty());
        assert_eq!(SteeringMode::parse("auto"), Some(SteeringMode::Auto));
        assert_eq!(
            SteeringMode::parse("hardware"),
            Some(SteeringMode::Hardware)
        );
        assert_eq!(
            SteeringMode::parse("software"),
            Some(SteeringMode::Software)
        );
        assert_eq!(SteeringMode::parse("mlx5"), None);
    }

    #[test]
    fn outcomes_fall_back_with_the_message_or_fail_when_strict() {
        let line =
            "bifurcation: port p: no hardware steering (x); falling back to software".to_string();
        let auto = SteeringPlan::TryHardware { strict: false };
        let strict = SteeringPlan::TryHardware { strict: true };
        let hw = auto.outcome("p", Some(Ok(3))).unwrap();
        assert_eq!(hw, Steering::Hardware { rules: 3 });
        assert_eq!((hw.hw(), hw.fallbacks()), (1, 0));
        assert_eq!(strict.outcome("p", Some(Ok(3))).unwrap().hw(), 1);
        let sw = auto.outcome("p", Some(Err(line.clone()))).unwrap();
        assert_eq!((sw.hw(), sw.fallbacks()), (0, 1));
        assert!(matches!(&sw, Steering::Software { message, .. } if *message == line));
        let e = strict.outcome("p", Some(Err(line.clone()))).unwrap_err();
        assert!(e.starts_with(&line) && e.contains("\"auto\""), "{e}");
        let own = SteeringPlan::OwnPort.outcome("p", None).unwrap();
        assert_eq!((own.hw(), own.fallbacks()), (0, 0));
        let conf = SteeringPlan::Software.outcome("p", None).unwrap();
        assert_eq!((conf.hw(), conf.fallbacks()), (0, 0));
        assert!(
            matches!(&conf, Steering::Software { message, .. } if message.contains("port p") && message.contains("configured"))
        );
        assert!(strict.outcome("p", None).is_err());
        assert_eq!(auto.outcome("p", None).unwrap().fallbacks(), 1);
    }
}

//! SR-IOV command generator for ConnectX-4 Lx / mlx5: from a plan (PF, number of VFs,
//! MACs, trust, spoof checking, hugepages, NUMA) to the `devlink` / `ip link` /
//! `ethtool` / sysfs commands that set the host up, printed for an operator to review
//! and run (nothing is executed). docs/operations.md explains each step.
//!
//! mlx5 is a bifurcated driver: the VF netdevs stay bound to `mlx5_core` (no vfio), the
//! kernel keeps using them, and DPDK opens the same VF by PCI address; with
//! `rte_flow_isolate` luna receives only the flows its rules name.

use core::fmt;

/// What to set up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SriovPlan {
    /// PF netdev name (`ens1f0`).
    pub pf: String,
    /// PF PCI address (`0000:03:00.0`), for `devlink`; omitted if unknown.
    pub pci: Option<String>,
    /// Number of VFs to create.
    pub vfs: u16,
    /// MAC of VF 0; VF `i` gets this plus `i` in the low bytes.
    pub mac_base: [u8; 6],
    /// VF trust (needed for promiscuous / all-multicast on a VF).
    pub trust: bool,
    /// MAC/VLAN anti-spoof checking on the VFs.
    pub spoofchk: bool,
    /// VLAN per VF (the PF inserts and strips it), if any.
    pub vlan: Option<u16>,
    /// MTU of the PF and VFs, if it should be set.
    pub mtu: Option<u16>,
    /// 2 MiB hugepages to reserve on the PF's NUMA node.
    pub hugepages_2m: u32,
    /// NUMA node of the PF (read it from sysfs when unknown: the generator prints how).
    pub numa_node: Option<u32>,
}

/// Why a plan is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SriovError {
    /// Not a valid interface name.
    BadInterface(String),
    /// Not a PCI address `DDDD:BB:DD.F`.
    BadPci(String),
    /// VF count out of 1..=127 (ConnectX-4 Lx firmware maximum per PF).
    BadVfCount(u16),
    /// The base MAC is multicast or all zero, or the VFs' MACs would wrap.
    BadMac(String),
    /// VLAN id out of 1..=4094.
    BadVlan(u16),
    /// MTU out of 68..=9978 (mlx5 maximum).
    BadMtu(u16),
    /// No hugepages.
    NoHugepages,
}

impl fmt::Display for SriovError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SriovError::BadInterface(s) => write!(
                f,
                "{s:?} is not an interface name (1-15 characters, no '/', whitespace or ':')"
            ),
            SriovError::BadPci(s) => {
                write!(f, "{s:?} is not a PCI address; write it as 0000:03:00.0")
            }
            SriovError::BadVfCount(n) => write!(
                f,
                "{n} VFs: ConnectX-4 Lx supports 1 to 127 per PF (also set SRIOV_EN and NUM_OF_VFS in firmware with mlxconfig)"
            ),
            SriovError::BadMac(s) => write!(f, "{s}"),
            SriovError::BadVlan(v) => write!(f, "VLAN {v} is outside 1..=4094"),
            SriovError::BadMtu(m) => write!(f, "MTU {m} is outside 68..=9978"),
            SriovError::NoHugepages => {
                f.write_str("0 hugepages: DPDK needs some; give --hugepages (2 MiB pages)")
            }
        }
    }
}

impl std::error::Error for SriovError {}

/// Formats a MAC as `02:00:00:00:10:00`.
pub fn mac_string(m: [u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Parses `02:00:00:00:10:00`.
pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let parts: Vec<&str> = s.split(':').collect();
    if parts.len() != 6 {
        return None;
    }
    let mut m = [0u8; 6];
    for (o, p) in m.iter_mut().zip(parts) {
        if p.len() != 2 {
            return None;
        }
        *o = u8::from_str_radix(p, 16).ok()?;
    }
    Some(m)
}

fn valid_ifname(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 15
        && s != "."
        && s != ".."
        && s.chars()
            .all(|c| c.is_ascii_graphic() && c != '/' && c != ':')
}

fn valid_pci(s: &str) -> bool {
    let b = s.as_bytes();
    let hex = |r: std::ops::Range<usize>| b[r].iter().all(|c| c.is_ascii_hexdigit());
    b.len() == 12
        && hex(0..4)
        && b[4] == b':'
        && hex(5..7)
        && b[7] == b':'
        && hex(8..10)
        && b[10] == b'.'
        && (b'0'..=b'7').contains(&b[11])
}

impl SriovPlan {
    /// A plan with the defaults: trust off, spoof checking on, 1024 hugepages.
    pub fn new(pf: impl Into<String>, vfs: u16) -> Self {
        SriovPlan {
            pf: pf.into(),
            pci: None,
            vfs,
            mac_base: [0x02, 0, 0, 0, 0x10, 0],
            trust: false,
            spoofchk: true,
            vlan: None,
            mtu: None,
            hugepages_2m: 1024,
            numa_node: None,
        }
    }

    /// The MAC of VF `i`.
    pub fn vf_mac(&self, i: u16) -> [u8; 6] {
        let mut m = self.mac_base;
        let low = u16::from_be_bytes([m[4], m[5]]).wrapping_add(i);
        m[4..6].copy_from_slice(&low.to_be_bytes());
        m
    }

    fn check(&self) -> Result<(), SriovError> {
        if !valid_ifname(&self.pf) {
            return Err(SriovError::BadInterface(self.pf.clone()));
        }
        if let Some(p) = &self.pci {
            if !valid_pci(p) {
                return Err(SriovError::BadPci(p.clone()));
            }
        }
        if !(1..=127).contains(&self.vfs) {
            return Err(SriovError::BadVfCount(self.vfs));
        }
        let m = self.mac_base;
        if m[0] & 1 != 0 {
            return Err(SriovError::BadMac(format!(
                "base MAC {} is multicast; VFs need unicast MACs (e.g. 02:00:00:00:10:00)",
                mac_string(m)
            )));
        }
        if m == [0; 6] {
            return Err(SriovError::BadMac(
                "base MAC is all zero; give one (e.g. 02:00:00:00:10:00)".into(),
            ));
        }
        if u32::from(u16::from_be_bytes([m[4], m[5]])) + u32::from(self.vfs) > 0x1_0000 {
            return Err(SriovError::BadMac(format!(
                "base MAC {} + {} VFs wraps its low 16 bits; pick a lower base",
                mac_string(m),
                self.vfs
            )));
        }
        if let Some(v) = self.vlan {
            if !(1..=4094).contains(&v) {
                return Err(SriovError::BadVlan(v));
            }
        }
        if let Some(mtu) = self.mtu {
            if !(68..=9978).contains(&mtu) {
                return Err(SriovError::BadMtu(mtu));
            }
        }
        if self.hugepages_2m == 0 {
            return Err(SriovError::NoHugepages);
        }
        Ok(())
    }

    /// The commands, in order, with `#` comment lines between the steps.
    pub fn commands(&self) -> Result<Vec<String>, SriovError> {
        self.check()?;
        let pf = &self.pf;
        let onoff = |b: bool| if b { "on" } else { "off" };
        let mut out = vec![format!(
            "# SR-IOV for {pf} (ConnectX-4 Lx / mlx5): {} VFs, trust {}, spoofchk {}",
            self.vfs,
            onoff(self.trust),
            onoff(self.spoofchk)
        )];
        out.push(format!(
            "# 0. once, in firmware (then a cold reboot): mlxconfig -d {} set SRIOV_EN=1 NUM_OF_VFS={}",
            self.pci.as_deref().unwrap_or("<pf pci>"),
            self.vfs
        ));
        out.push(
            "# 1. PF: legacy eswitch (VFs are plain NIC functions), then create the VFs".into(),
        );
        if let Some(pci) = &self.pci {
            out.push(format!("devlink dev eswitch set pci/{pci} mode legacy"));
        }
        out.push(format!("echo 0 > /sys/class/net/{pf}/device/sriov_numvfs"));
        out.push(format!(
            "echo {} > /sys/class/net/{pf}/device/sriov_numvfs",
            self.vfs
        ));
        if let Some(mtu) = self.mtu {
            out.push(format!("ip link set dev {pf} mtu {mtu}"));
        }
        out.push("# 2. per VF: fixed MAC, trust, spoof checking, link state follows the PF".into());
        for i in 0..self.vfs {
            out.push(format!(
                "ip link set dev {pf} vf {i} mac {}",
                mac_string(self.vf_mac(i))
            ));
            if let Some(v) = self.vlan {
                out.push(format!("ip link set dev {pf} vf {i} vlan {v}"));
            }
            out.push(format!(
                "ip link set dev {pf} vf {i} trust {}",
                onoff(self.trust)
            ));
            out.push(format!(
                "ip link set dev {pf} vf {i} spoofchk {}",
                onoff(self.spoofchk)
            ));
            out.push(format!("ip link set dev {pf} vf {i} state auto"));
        }
        out.push(
            "# 3. VF netdevs stay on mlx5_core (bifurcated: kernel and DPDK share each VF);".into(),
        );
        out.push("#    check the driver, find each VF's PCI address and netdev".into());
        for i in 0..self.vfs {
            out.push(format!(
                "readlink -f /sys/class/net/{pf}/device/virtfn{i}; ls /sys/class/net/{pf}/device/virtfn{i}/net"
            ));
        }
        out.push(format!(
            "ethtool -i {pf}   # driver: mlx5_core (bifurcated); firmware-version for DPDK's mlx5 notes"
        ));
        out.push(
            "# 4. hugepages on the PF's NUMA node (luna's cores and memory on the same node)"
                .into(),
        );
        let node = match self.numa_node {
            Some(n) => n.to_string(),
            None => {
                out.push(format!(
                    "NODE=$(cat /sys/class/net/{pf}/device/numa_node); [ \"$NODE\" -ge 0 ] || NODE=0"
                ));
                "$NODE".into()
            }
        };
        out.push(format!(
            "echo {} > /sys/devices/system/node/node{node}/hugepages/hugepages-2048kB/nr_hugepages",
            self.hugepages_2m
        ));
        out.push(format!(
            "cat /sys/devices/system/node/node{node}/cpulist   # pick luna's cores from this list"
        ));
        out.push(
            "# 5. luna on VF i: EAL -a <VF i PCI>,dv_flow_en=1 --socket-mem on that node;".into(),
        );
        out.push(
            "#    it isolates the port (rte_flow_isolate) and installs its rules per VF".into(),
        );
        out.push(
            "#    (`bifurcation rules` lists them); ARP, ICMP, ssh stay with the VF's netdev"
                .into(),
        );
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn four_vfs_with_pci_and_node() {
        let mut p = SriovPlan::new("ens1f0", 4);
        p.pci = Some("0000:03:00.0".into());
        p.numa_node = Some(1);
        p.trust = true;
        p.mtu = Some(9000);
        let c = p.commands().unwrap();
        let has = |s: &str| c.iter().any(|l| l == s);
        assert!(has("devlink dev eswitch set pci/0000:03:00.0 mode legacy"));
        assert!(c.iter().any(|l| l.starts_with('#')
            && l.contains("mlxconfig -d 0000:03:00.0 set SRIOV_EN=1 NUM_OF_VFS=4")));
        assert!(has("echo 4 > /sys/class/net/ens1f0/device/sriov_numvfs"));
        assert!(has("ip link set dev ens1f0 mtu 9000"));
        assert!(has("ip link set dev ens1f0 vf 0 mac 02:00:00:00:10:00"));
        assert!(has("ip link set dev ens1f0 vf 3 mac 02:00:00:00:10:03"));
        assert!(has("ip link set dev ens1f0 vf 3 trust on"));
        assert!(has("ip link set dev ens1f0 vf 3 spoofchk on"));
        assert!(c.iter().any(|l| l.starts_with("ethtool -i ens1f0 ")));
        assert!(has(
            "echo 1024 > /sys/devices/system/node/node1/hugepages/hugepages-2048kB/nr_hugepages"
        ));
        assert!(!c.iter().any(|l| l.contains("vf 4 ")));
        // Zeroing before setting the count: the kernel refuses to change a non-zero count.
        let zero = c.iter().position(|l| l.starts_with("echo 0 >")).unwrap();
        let four = c.iter().position(|l| l.starts_with("echo 4 >")).unwrap();
        assert!(zero < four);
        let macs = c.iter().filter(|l| l.contains(" mac ")).count();
        assert_eq!(macs, 4);
    }

    #[test]
    fn defaults_without_pci_read_the_node() {
        let mut p = SriovPlan::new("ens1f1", 1);
        p.vlan = Some(100);
        let c = p.commands().unwrap();
        assert!(!c.iter().any(|l| l.starts_with("devlink")));
        assert!(c
            .iter()
            .any(|l| l == "ip link set dev ens1f1 vf 0 vlan 100"));
        assert!(c
            .iter()
            .any(|l| l == "ip link set dev ens1f1 vf 0 trust off"));
        assert!(c
            .iter()
            .any(|l| l.starts_with("NODE=$(cat /sys/class/net/ens1f1/device/numa_node)")));
        assert!(c.iter().any(|l| l.contains("node$NODE/hugepages")));
    }

    #[test]
    fn bad_plans() {
        let e = |p: SriovPlan| p.commands().unwrap_err();
        assert_eq!(e(SriovPlan::new("ens1f0", 0)), SriovError::BadVfCount(0));
        assert_eq!(
            e(SriovPlan::new("ens1f0", 128)),
            SriovError::BadVfCount(128)
        );
        assert!(matches!(
            e(SriovPlan::new("a/b", 1)),
            SriovError::BadInterface(_)
        ));
        assert!(matches!(
            e(SriovPlan::new("averyveryverylongname", 1)),
            SriovError::BadInterface(_)
        ));
        let mut p = SriovPlan::new("ens1f0", 1);
        p.pci = Some("03:00.0".into());
        assert!(matches!(e(p), SriovError::BadPci(_)));
        let mut p = SriovPlan::new("ens1f0", 1);
        p.mac_base = [0x01, 0, 0, 0, 0, 0];
        assert!(e(p).to_string().contains("multicast"));
        let mut p = SriovPlan::new("ens1f0", 2);
        p.mac_base = [0x02, 0, 0, 0, 0xff, 0xff];
        assert!(e(p).to_string().contains("wraps"));
        let mut p = SriovPlan::new("ens1f0", 1);
        p.vlan = Some(4095);
        assert_eq!(e(p), SriovError::BadVlan(4095));
        let mut p = SriovPlan::new("ens1f0", 1);
        p.hugepages_2m = 0;
        assert_eq!(e(p), SriovError::NoHugepages);
    }

    #[test]
    fn mac_round_trip() {
        assert_eq!(
            parse_mac("02:00:00:00:10:0a"),
            Some([2, 0, 0, 0, 0x10, 0x0a])
        );
        assert_eq!(mac_string([2, 0, 0, 0, 0x10, 0x0a]), "02:00:00:00:10:0a");
        assert_eq!(parse_mac("02:00:00:00:10"), None);
        assert_eq!(parse_mac("02:00:00:00:10:0g"), None);
    }
}

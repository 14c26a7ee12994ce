//! Which addresses the proxy never dials on a name's behalf.
//!
//! A name rule (`api.example.com`, `*.example.org`) opens public addresses
//! only: whatever the name resolves to is checked here, so a name that points
//! at 127.0.0.1, a private network or 169.254.169.254 (the cloud metadata
//! endpoint) is refused. Only a rule that is itself an IP literal opens such an
//! address, and then only that exact address.
//!
//! The ranges are data ([`IPV4_RANGES`], [`IPV6_RANGES`]); IPv6 forms that
//! carry an IPv4 address (IPv4-mapped, NAT64, 6to4) are judged by the IPv4
//! address they carry, so `::ffff:169.254.169.254` is link-local.

use std::fmt;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Whether the kernel routes `ip` to this host itself (a route of type
/// local: any interface's address, public ones too, and whole local ranges
/// a route may add): a name that resolves to one would reach the host's own
/// services, those bound to every address among them, over loopback, which
/// host firewalls let through. Asked of the kernel as `ip route get` asks
/// it, through a route netlink socket; an error means it could not be
/// asked, and the caller refuses the address.
pub fn is_this_hosts(ip: IpAddr) -> io::Result<bool> {
    use rustix::net::{AddressFamily, RecvFlags, SendFlags, SocketType, netlink, recv, sendto, socket};
    // The kernel's message numbers and layouts (linux/netlink.h, linux/rtnetlink.h).
    const RTM_NEWROUTE: u16 = 24;
    const RTM_GETROUTE: u16 = 26;
    const NLMSG_ERROR: u16 = 2;
    const NLM_F_REQUEST: u16 = 1;
    const RTA_DST: u16 = 1;
    const RTN_LOCAL: u8 = 2;
    const HEADER: usize = 16;
    let (family, address): (u8, Vec<u8>) = match ip {
        IpAddr::V4(v4) => (libc_family::INET, v4.octets().to_vec()),
        IpAddr::V6(v6) => (libc_family::INET6, v6.octets().to_vec()),
    };
    let attribute = 4 + address.len();
    let length = HEADER + 12 + attribute;
    let mut request = Vec::with_capacity(length);
    request.extend_from_slice(&(length as u32).to_ne_bytes());
    request.extend_from_slice(&RTM_GETROUTE.to_ne_bytes());
    request.extend_from_slice(&NLM_F_REQUEST.to_ne_bytes());
    request.extend_from_slice(&1u32.to_ne_bytes()); // sequence
    request.extend_from_slice(&0u32.to_ne_bytes()); // to the kernel
    // rtmsg: family, destination prefix length, then zeros (source, tos,
    // table, protocol, scope, type, flags).
    request.extend_from_slice(&[family, (address.len() * 8) as u8, 0, 0, 0, 0, 0, 0]);
    request.extend_from_slice(&0u32.to_ne_bytes());
    request.extend_from_slice(&(attribute as u16).to_ne_bytes());
    request.extend_from_slice(&RTA_DST.to_ne_bytes());
    request.extend_from_slice(&address);
    // NETLINK_ROUTE is protocol 0: rustix takes it as `None`.
    let route = socket(AddressFamily::NETLINK, SocketType::RAW, None)?;
    sendto(&route, &request, SendFlags::empty(), &netlink::SocketAddrNetlink::new(0, 0))?;
    let mut answer = vec![0u8; 4096];
    let (_, got) = recv(&route, &mut answer[..], RecvFlags::empty())?;
    let answer = &answer[..got.min(answer.len())];
    let kind = answer.get(4..6).map(|b| u16::from_ne_bytes([b[0], b[1]]));
    match kind {
        Some(RTM_NEWROUTE) => answer
            .get(HEADER + 7)
            .map(|route_type| *route_type == RTN_LOCAL)
            .ok_or_else(|| io::Error::other("a route answer too short")),
        Some(NLMSG_ERROR) => {
            let code = answer
                .get(HEADER..HEADER + 4)
                .map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
                .ok_or_else(|| io::Error::other("an error answer too short"))?;
            match -code {
                // No route there: not this host's, and a dial fails on its own.
                errno if errno == libc_errno::ENETUNREACH || errno == libc_errno::EHOSTUNREACH => Ok(false),
                errno => Err(io::Error::from_raw_os_error(errno)),
            }
        }
        _ => Err(io::Error::other("an answer that is not a route")),
    }
}

/// The address families, as route netlink numbers them.
mod libc_family {
    pub const INET: u8 = 2;
    pub const INET6: u8 = 10;
}

/// The errors a route lookup answers when there is no route.
mod libc_errno {
    pub const ENETUNREACH: i32 = 101;
    pub const EHOSTUNREACH: i32 = 113;
}

/// What kind of address an IP is, as far as egress is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AddressClass {
    /// A global unicast address: the only class a name rule may reach.
    Public,
    /// 0.0.0.0/8 and `::`: connecting there reaches this host.
    Unspecified,
    /// 127.0.0.0/8 and `::1`.
    Loopback,
    /// 10/8, 172.16/12, 192.168/16, fc00::/7 and the local-use NAT64 prefix.
    Private,
    /// 100.64.0.0/10, carrier-grade NAT.
    SharedAddressSpace,
    /// 169.254.0.0/16 (which holds the cloud metadata endpoint) and fe80::/10.
    LinkLocal,
    /// fec0::/10, deprecated site-local IPv6.
    SiteLocal,
    /// 192.0.0.0/24 and 2001::/23, IETF protocol assignments (Teredo among them).
    ProtocolAssignment,
    /// 192.0.2/24, 198.51.100/24, 203.0.113/24, 2001:db8::/32, 3fff::/20.
    Documentation,
    /// 198.18.0.0/15.
    Benchmarking,
    /// 224.0.0.0/4 and ff00::/8.
    Multicast,
    /// 255.255.255.255.
    Broadcast,
    /// `::a.b.c.d`, the deprecated IPv4-compatible IPv6 form.
    Ipv4Compatible,
    /// 240.0.0.0/4, the 6to4 relay anycast 192.88.99/24, the IPv6 discard
    /// prefix, and every IPv6 address outside 2000::/3.
    Reserved,
}

impl AddressClass {
    /// Whether a name rule may never reach an address of this class.
    pub fn is_forbidden(self) -> bool {
        self != AddressClass::Public
    }

    /// A few words for messages and records.
    pub fn describe(self) -> &'static str {
        match self {
            AddressClass::Public => "public",
            AddressClass::Unspecified => "unspecified (this host)",
            AddressClass::Loopback => "loopback",
            AddressClass::Private => "private",
            AddressClass::SharedAddressSpace => "carrier-grade NAT",
            AddressClass::LinkLocal => "link-local (where cloud metadata lives)",
            AddressClass::SiteLocal => "site-local",
            AddressClass::ProtocolAssignment => "reserved for IETF protocols",
            AddressClass::Documentation => "documentation-only",
            AddressClass::Benchmarking => "benchmarking-only",
            AddressClass::Multicast => "multicast",
            AddressClass::Broadcast => "broadcast",
            AddressClass::Ipv4Compatible => "deprecated IPv4-compatible IPv6",
            AddressClass::Reserved => "reserved",
        }
    }
}

impl fmt::Display for AddressClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.describe())
    }
}

/// IPv4 ranges a name rule never reaches: (network, prefix length, class).
/// The first match wins, so 255.255.255.255 comes before 240/4.
pub const IPV4_RANGES: [([u8; 4], u8, AddressClass); 16] = [
    ([0, 0, 0, 0], 8, AddressClass::Unspecified),
    ([10, 0, 0, 0], 8, AddressClass::Private),
    ([100, 64, 0, 0], 10, AddressClass::SharedAddressSpace),
    ([127, 0, 0, 0], 8, AddressClass::Loopback),
    ([169, 254, 0, 0], 16, AddressClass::LinkLocal),
    ([172, 16, 0, 0], 12, AddressClass::Private),
    ([192, 0, 0, 0], 24, AddressClass::ProtocolAssignment),
    ([192, 0, 2, 0], 24, AddressClass::Documentation),
    ([192, 88, 99, 0], 24, AddressClass::Reserved),
    ([192, 168, 0, 0], 16, AddressClass::Private),
    ([198, 18, 0, 0], 15, AddressClass::Benchmarking),
    ([198, 51, 100, 0], 24, AddressClass::Documentation),
    ([203, 0, 113, 0], 24, AddressClass::Documentation),
    ([224, 0, 0, 0], 4, AddressClass::Multicast),
    ([255, 255, 255, 255], 32, AddressClass::Broadcast),
    ([240, 0, 0, 0], 4, AddressClass::Reserved),
];

/// IPv6 ranges a name rule never reaches, checked after the forms that carry
/// an IPv4 address. The first match wins. Anything outside 2000::/3 that no
/// row names is [`AddressClass::Reserved`].
pub const IPV6_RANGES: [(u128, u8, AddressClass); 12] = [
    (0, 128, AddressClass::Unspecified),
    (1, 128, AddressClass::Loopback),
    (0, 96, AddressClass::Ipv4Compatible),
    (0x0064_ff9b_0001 << 80, 48, AddressClass::Private),
    (0x0100 << 112, 64, AddressClass::Reserved),
    (0x2001 << 112, 23, AddressClass::ProtocolAssignment),
    (0x2001_0db8 << 96, 32, AddressClass::Documentation),
    (0x3fff << 112, 20, AddressClass::Documentation),
    (0xfc00 << 112, 7, AddressClass::Private),
    (0xfe80 << 112, 10, AddressClass::LinkLocal),
    (0xfec0 << 112, 10, AddressClass::SiteLocal),
    (0xff00 << 112, 8, AddressClass::Multicast),
];

/// The class of `ip`. IPv6 addresses that carry an IPv4 address take that
/// address's class.
pub fn classify(ip: IpAddr) -> AddressClass {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => match embedded_ipv4(v6) {
            Some(v4) => classify_v4(v4),
            None => classify_v6(v6),
        },
    }
}

/// Whether a name rule may never reach `ip`.
pub fn is_forbidden(ip: IpAddr) -> bool {
    classify(ip).is_forbidden()
}

/// The IPv4 address an IPv6 address stands for, in the forms where the
/// network delivers it to that IPv4 host: IPv4-mapped (`::ffff:a.b.c.d`),
/// NAT64 (`64:ff9b::a.b.c.d`) and 6to4 (`2002:AABB:CCDD::/48`).
pub fn embedded_ipv4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let bits = u128::from(ip);
    let low32 = Ipv4Addr::from((bits & 0xffff_ffff) as u32);
    if bits >> 32 == 0xffff {
        return Some(low32);
    }
    if bits >> 32 == 0x0064_ff9b << 64 {
        return Some(low32);
    }
    if bits >> 112 == 0x2002 {
        return Some(Ipv4Addr::from(((bits >> 80) & 0xffff_ffff) as u32));
    }
    None
}

fn classify_v4(ip: Ipv4Addr) -> AddressClass {
    let bits = u32::from(ip);
    IPV4_RANGES
        .iter()
        .find(|(network, prefix, _)| in_prefix(u128::from(bits), u128::from(u32::from_be_bytes(*network)), *prefix, 32))
        .map_or(AddressClass::Public, |(_, _, class)| *class)
}

fn classify_v6(ip: Ipv6Addr) -> AddressClass {
    let bits = u128::from(ip);
    if let Some((_, _, class)) = IPV6_RANGES.iter().find(|(network, prefix, _)| in_prefix(bits, *network, *prefix, 128))
    {
        return *class;
    }
    // Global unicast is 2000::/3; nothing else is assigned for the public.
    if bits >> 125 == 0b001 { AddressClass::Public } else { AddressClass::Reserved }
}

/// Whether the top `prefix` of `width` bits of `value` equal those of `network`.
fn in_prefix(value: u128, network: u128, prefix: u8, width: u32) -> bool {
    let shift = width - u32::from(prefix);
    value.checked_shr(shift).unwrap_or(0) == network.checked_shr(shift).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(text: &str) -> AddressClass {
        classify(text.parse().unwrap())
    }

    #[test]
    fn every_listed_ipv4_range_is_forbidden_at_both_ends() {
        let cases = [
            ("0.0.0.0", AddressClass::Unspecified),
            ("0.255.255.255", AddressClass::Unspecified),
            ("10.0.0.1", AddressClass::Private),
            ("10.255.255.255", AddressClass::Private),
            ("100.64.0.0", AddressClass::SharedAddressSpace),
            ("100.127.255.255", AddressClass::SharedAddressSpace),
            ("127.0.0.1", AddressClass::Loopback),
            ("127.255.255.254", AddressClass::Loopback),
            ("169.254.169.254", AddressClass::LinkLocal),
            ("169.254.0.0", AddressClass::LinkLocal),
            ("172.16.0.0", AddressClass::Private),
            ("172.31.255.255", AddressClass::Private),
            ("192.0.0.8", AddressClass::ProtocolAssignment),
            ("192.0.2.1", AddressClass::Documentation),
            ("192.88.99.1", AddressClass::Reserved),
            ("192.168.1.1", AddressClass::Private),
            ("198.18.0.1", AddressClass::Benchmarking),
            ("198.19.255.255", AddressClass::Benchmarking),
            ("198.51.100.7", AddressClass::Documentation),
            ("203.0.113.9", AddressClass::Documentation),
            ("224.0.0.1", AddressClass::Multicast),
            ("239.255.255.255", AddressClass::Multicast),
            ("240.0.0.1", AddressClass::Reserved),
            ("255.255.255.254", AddressClass::Reserved),
            ("255.255.255.255", AddressClass::Broadcast),
        ];
        for (ip, expected) in cases {
            assert_eq!(class(ip), expected, "{ip}");
            assert!(is_forbidden(ip.parse().unwrap()), "{ip}");
        }
    }

    #[test]
    fn neighbours_of_forbidden_ranges_are_public() {
        for ip in [
            "1.1.1.1",
            "8.8.8.8",
            "9.255.255.255",
            "11.0.0.0",
            "100.63.255.255",
            "100.128.0.0",
            "126.255.255.255",
            "128.0.0.0",
            "169.253.255.255",
            "169.255.0.0",
            "172.15.255.255",
            "172.32.0.0",
            "192.0.1.0",
            "192.0.3.0",
            "192.167.255.255",
            "192.169.0.0",
            "198.17.255.255",
            "198.20.0.0",
            "223.255.255.255",
        ] {
            assert_eq!(class(ip), AddressClass::Public, "{ip}");
        }
    }

    #[test]
    fn every_listed_ipv6_range_is_forbidden() {
        let cases = [
            ("::", AddressClass::Unspecified),
            ("::1", AddressClass::Loopback),
            ("::169.254.169.254", AddressClass::Ipv4Compatible),
            ("::8.8.8.8", AddressClass::Ipv4Compatible),
            ("fe80::1", AddressClass::LinkLocal),
            ("febf:ffff::1", AddressClass::LinkLocal),
            ("fc00::1", AddressClass::Private),
            ("fdff:ffff::1", AddressClass::Private),
            ("fec0::1", AddressClass::SiteLocal),
            ("ff02::1", AddressClass::Multicast),
            ("2001:db8::1", AddressClass::Documentation),
            ("3fff:0fff::1", AddressClass::Documentation),
            ("2001::1", AddressClass::ProtocolAssignment),
            ("2001:1ff::1", AddressClass::ProtocolAssignment),
            ("64:ff9b:1::a00:1", AddressClass::Private),
            ("100::1", AddressClass::Reserved),
            ("4000::1", AddressClass::Reserved),
            ("1234::1", AddressClass::Reserved),
        ];
        for (ip, expected) in cases {
            assert_eq!(class(ip), expected, "{ip}");
        }
    }

    #[test]
    fn ipv6_forms_that_carry_ipv4_take_its_class() {
        assert_eq!(class("::ffff:169.254.169.254"), AddressClass::LinkLocal);
        assert_eq!(class("::ffff:a9fe:a9fe"), AddressClass::LinkLocal);
        assert_eq!(class("::ffff:127.0.0.1"), AddressClass::Loopback);
        assert_eq!(class("::ffff:8.8.8.8"), AddressClass::Public);
        assert_eq!(class("64:ff9b::169.254.169.254"), AddressClass::LinkLocal);
        assert_eq!(class("64:ff9b::10.0.0.1"), AddressClass::Private);
        assert_eq!(class("64:ff9b::8.8.8.8"), AddressClass::Public);
        assert_eq!(class("2002:a9fe:a9fe::1"), AddressClass::LinkLocal);
        assert_eq!(class("2002:7f00:1::"), AddressClass::Loopback);
        assert_eq!(class("2002:0808:0808::1"), AddressClass::Public);
        assert_eq!(embedded_ipv4("2002:c0a8:0101::".parse().unwrap()), Some(Ipv4Addr::new(192, 168, 1, 1)));
        assert_eq!(embedded_ipv4("2606:4700::1111".parse().unwrap()), None);
    }

    #[test]
    fn global_unicast_ipv6_is_public() {
        for ip in ["2606:4700:4700::1111", "2a00:1450:4001::1", "2001:200::1", "2400:cb00::1"] {
            assert_eq!(class(ip), AddressClass::Public, "{ip}");
        }
    }
}

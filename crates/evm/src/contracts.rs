//! The workload's contracts (Solidity sources in `crates/evm/contracts/`, bytecode compiled
//! once with solc 0.8.28 by `contracts/compile.sh` and checked in beside them), and the
//! calldata and storage slots the workloads need. Each contract's storage layout is fixed
//! in its source, so a genesis state can hold balances written straight into its slots.

use alloy_primitives::{hex, keccak256, Address, Bytes, B256, U256};

/// One compiled contract.
#[derive(Clone, Copy, Debug)]
pub struct Contract {
    pub name: &'static str,
    init_hex: &'static str,
    runtime_hex: &'static str,
}

impl Contract {
    /// The creation code: what a transaction without a recipient carries to deploy it.
    pub fn init_code(&self) -> Bytes {
        decode_hex(self.init_hex)
    }

    /// The deployed code: what a genesis account holds.
    pub fn runtime_code(&self) -> Bytes {
        decode_hex(self.runtime_hex)
    }
}

fn decode_hex(text: &str) -> Bytes {
    // Checked in and checked by `every_contract_decodes`; empty would fail every call.
    hex::decode(text.trim()).map(Bytes::from).unwrap_or_default()
}

/// An ERC-20 token: `transfer`, `approve`, `transferFrom`, `balanceOf`, `allowance`.
pub const TOKEN: Contract = Contract {
    name: "Token",
    init_hex: include_str!("../contracts/build/Token.init.hex"),
    runtime_hex: include_str!("../contracts/build/Token.runtime.hex"),
};

/// `giveBirth(kitty)`: writes a value that depends on the block into a fixed slot.
pub const KITTIES: Contract = Contract {
    name: "Kitties",
    init_hex: include_str!("../contracts/build/Kitties.init.hex"),
    runtime_hex: include_str!("../contracts/build/Kitties.runtime.hex"),
};

/// `enter()`: writes a slot chosen by the block number and the parent block's hash.
pub const LOTTERY: Contract = Contract {
    name: "Lottery",
    init_hex: include_str!("../contracts/build/Lottery.init.hex"),
    runtime_hex: include_str!("../contracts/build/Lottery.runtime.hex"),
};

/// The 4-byte function selector of a Solidity signature such as `transfer(address,uint256)`.
pub fn selector(signature: &str) -> [u8; 4] {
    let hash = keccak256(signature.as_bytes());
    [hash[0], hash[1], hash[2], hash[3]]
}

/// Calldata: the selector, then each argument as one 32-byte word (static types only).
pub fn calldata(signature: &str, words: &[B256]) -> Bytes {
    let mut data = Vec::with_capacity(4 + 32 * words.len());
    data.extend_from_slice(&selector(signature));
    for word in words {
        data.extend_from_slice(word.as_slice());
    }
    data.into()
}

/// An address as an ABI word (left-padded).
pub fn address_word(address: Address) -> B256 {
    address.into_word()
}

/// A number as an ABI word.
pub fn uint_word(value: U256) -> B256 {
    B256::from(value)
}

/// The storage slot of `mapping[key]` for a mapping declared at `slot`, as Solidity lays it
/// out: keccak-256 of the key's word followed by the slot's word.
pub fn mapping_slot(key: B256, slot: U256) -> U256 {
    let mut preimage = [0u8; 64];
    preimage[..32].copy_from_slice(key.as_slice());
    preimage[32..].copy_from_slice(&slot.to_be_bytes::<32>());
    U256::from_be_bytes(keccak256(preimage).0)
}

/// Calldata and slots of [`TOKEN`].
pub mod token {
    use super::*;

    const BALANCES: U256 = U256::ZERO;
    const ALLOWANCES: U256 = U256::from_limbs([1, 0, 0, 0]);
    /// The slot of `totalSupply`.
    pub const TOTAL_SUPPLY_SLOT: U256 = U256::from_limbs([2, 0, 0, 0]);

    pub fn transfer(to: Address, amount: U256) -> Bytes {
        calldata("transfer(address,uint256)", &[address_word(to), uint_word(amount)])
    }

    pub fn approve(spender: Address, amount: U256) -> Bytes {
        calldata("approve(address,uint256)", &[address_word(spender), uint_word(amount)])
    }

    pub fn transfer_from(from: Address, to: Address, amount: U256) -> Bytes {
        calldata("transferFrom(address,address,uint256)", &[address_word(from), address_word(to), uint_word(amount)])
    }

    pub fn balance_of(holder: Address) -> Bytes {
        calldata("balanceOf(address)", &[address_word(holder)])
    }

    /// The slot of `balanceOf[holder]`.
    pub fn balance_slot(holder: Address) -> U256 {
        mapping_slot(address_word(holder), BALANCES)
    }

    /// The slot of `allowance[owner][spender]`.
    pub fn allowance_slot(owner: Address, spender: Address) -> U256 {
        let inner = mapping_slot(address_word(owner), ALLOWANCES);
        mapping_slot(address_word(spender), inner)
    }
}

/// Calldata and slots of [`KITTIES`].
pub mod kitties {
    use super::*;

    /// The slot of `births`.
    pub const BIRTHS_SLOT: U256 = U256::from_limbs([1, 0, 0, 0]);

    pub fn give_birth(kitty: U256) -> Bytes {
        calldata("giveBirth(uint256)", &[uint_word(kitty)])
    }

    /// The slot of `genes[kitty]`.
    pub fn genes_slot(kitty: U256) -> U256 {
        mapping_slot(uint_word(kitty), U256::ZERO)
    }
}

/// Calldata and slots of [`LOTTERY`].
pub mod lottery {
    use super::*;

    /// Buckets `enter` chooses among (the contract's `BUCKETS`).
    pub const BUCKETS: u64 = 64;
    /// The slot of `entries`.
    pub const ENTRIES_SLOT: U256 = U256::from_limbs([1, 0, 0, 0]);

    pub fn enter() -> Bytes {
        calldata("enter()", &[])
    }

    /// The bucket an entry in block `number`, whose parent hashes to `parent_hash`, lands in.
    pub fn bucket(number: u64, parent_hash: B256) -> u64 {
        let mut preimage = [0u8; 64];
        preimage[..32].copy_from_slice(&U256::from(number).to_be_bytes::<32>());
        preimage[32..].copy_from_slice(parent_hash.as_slice());
        let hash = U256::from_be_bytes(keccak256(preimage).0);
        (hash % U256::from(BUCKETS)).to::<u64>()
    }

    /// The slot of `tickets[bucket]`.
    pub fn tickets_slot(bucket: u64) -> U256 {
        mapping_slot(uint_word(U256::from(bucket)), U256::ZERO)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_contract_decodes() {
        for contract in [TOKEN, KITTIES, LOTTERY] {
            assert!(contract.init_code().len() > contract.runtime_code().len(), "{}", contract.name);
            assert!(!contract.runtime_code().is_empty(), "{}", contract.name);
        }
    }

    #[test]
    fn selectors_are_the_erc20_ones() {
        assert_eq!(selector("transfer(address,uint256)"), [0xa9, 0x05, 0x9c, 0xbb]);
        assert_eq!(selector("approve(address,uint256)"), [0x09, 0x5e, 0xa7, 0xb3]);
        assert_eq!(selector("transferFrom(address,address,uint256)"), [0x23, 0xb8, 0x72, 0xdd]);
        assert_eq!(selector("balanceOf(address)"), [0x70, 0xa0, 0x82, 0x31]);
    }
}

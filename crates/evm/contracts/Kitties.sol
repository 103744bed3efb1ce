// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.28;

/// A breeding game in the spirit of CryptoKitties' `giveBirth`: the genes a birth writes
/// depend on the block it lands in (number and parent hash), but the slot it writes is the
/// kitty's own. A client that pre-executes with a wrong guess of the block still touches
/// the right slots; only the written values differ. Slot 0 `genes`, slot 1 `births`.
contract Kitties {
    mapping(uint256 => uint256) public genes;
    uint256 public births;

    event Birth(uint256 indexed kitty, uint256 genes);

    function giveBirth(uint256 kitty) external {
        uint256 mixed = mixGenes(genes[kitty], block.number, blockhash(block.number - 1));
        genes[kitty] = mixed;
        births += 1;
        emit Birth(kitty, mixed);
    }

    function mixGenes(uint256 parent, uint256 number, bytes32 seed) private pure returns (uint256) {
        return uint256(keccak256(abi.encode(parent, number, seed)));
    }
}

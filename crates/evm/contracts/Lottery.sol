// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.28;

/// A lottery whose ticket lands in a bucket chosen by the block: the storage slot an entry
/// writes depends on the block number and the parent block's hash. A client that
/// pre-executes with a wrong guess of the block touches a different slot than the miner
/// will, so its witnesses miss the real one. Slot 0 `tickets` (bucket => count),
/// slot 1 `entries`.
contract Lottery {
    uint256 public constant BUCKETS = 64;

    mapping(uint256 => uint256) public tickets;
    uint256 public entries;

    event Entered(address indexed player, uint256 bucket);

    function enter() external {
        uint256 bucket = uint256(keccak256(abi.encode(block.number, blockhash(block.number - 1)))) % BUCKETS;
        tickets[bucket] += 1;
        entries += 1;
        emit Entered(msg.sender, bucket);
    }
}

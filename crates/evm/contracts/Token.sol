// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.28;

/// An ERC-20 token for Virga's workloads. The storage layout is fixed because the workload
/// generator writes holders' balances straight into the genesis state:
/// slot 0 `balanceOf`, slot 1 `allowance`, slot 2 `totalSupply`.
contract Token {
    mapping(address => uint256) public balanceOf;
    mapping(address => mapping(address => uint256)) public allowance;
    uint256 public totalSupply;

    event Transfer(address indexed from, address indexed to, uint256 value);
    event Approval(address indexed owner, address indexed spender, uint256 value);

    function name() external pure returns (string memory) {
        return "Virga Token";
    }

    function symbol() external pure returns (string memory) {
        return "VRG";
    }

    function decimals() external pure returns (uint8) {
        return 18;
    }

    function transfer(address to, uint256 value) external returns (bool) {
        move(msg.sender, to, value);
        return true;
    }

    function approve(address spender, uint256 value) external returns (bool) {
        allowance[msg.sender][spender] = value;
        emit Approval(msg.sender, spender, value);
        return true;
    }

    function transferFrom(address from, address to, uint256 value) external returns (bool) {
        uint256 allowed = allowance[from][msg.sender];
        if (allowed != type(uint256).max) {
            require(allowed >= value, "allowance too low");
            allowance[from][msg.sender] = allowed - value;
        }
        move(from, to, value);
        return true;
    }

    function move(address from, address to, uint256 value) private {
        uint256 balance = balanceOf[from];
        require(balance >= value, "balance too low");
        unchecked {
            balanceOf[from] = balance - value;
        }
        balanceOf[to] += value;
        emit Transfer(from, to, value);
    }
}
